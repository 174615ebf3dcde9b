"""What the SQLite book writes to its store: records and the operations on
them, each a frozen value queued to the writer thread (store.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from discovery.book.contract import LeaseRecord
from discovery.book.rules import REPORTS_KEPT
from discovery.book.signals import REFUSALS_KEPT


@dataclass(frozen=True, slots=True)
class CooldownRecord:
    proxy: str
    target: str
    until: float


@dataclass(frozen=True, slots=True)
class ReportRecord:
    at: float
    lease_id: str
    proxy: str
    holder: str
    outcome: str
    target: str | None


@dataclass(frozen=True, slots=True)
class PutLease:
    lease: LeaseRecord


@dataclass(frozen=True, slots=True)
class EndLease:
    lease_id: str


@dataclass(frozen=True, slots=True)
class PutCooldown:
    """A `blocked` report's cooldown, merged by merge_cooldown's rule; `now`
    is the report's time (cooldowns over by then do not count towards the cap)."""

    cooldown: CooldownRecord
    now: float


@dataclass(frozen=True, slots=True)
class ForgetProxy:
    """A proxy left the fleet: its cooldowns and usage go."""

    proxy: str


@dataclass(frozen=True, slots=True)
class AddReport:
    report: ReportRecord


@dataclass(frozen=True, slots=True)
class AddRefusals:
    """A grant refused (409) at `at`: one row per group its selector matched
    (discovery/book/signals.py)."""

    at: float
    groups: tuple[str, ...]
    holder: str


@dataclass(frozen=True, slots=True)
class Prune:
    """Drops cooldowns that ended, reports older than `reports_before` and
    all but the newest `reports_kept` reports; refusals alike."""

    now: float
    reports_before: float
    reports_kept: int = REPORTS_KEPT
    refusals_before: float | None = None  # None: none is too old
    refusals_kept: int = REFUSALS_KEPT


@dataclass(frozen=True, slots=True)
class Touch:
    """Changes nothing but needs a real write (a WAL frame, an fsync): how a
    store that failed finds out it can write again."""


Op = PutLease | EndLease | PutCooldown | ForgetProxy | AddReport | AddRefusals | Prune | Touch
# How the book writes: one unit of ops, durable once awaited, StoreError if
# not (SqliteStore.write; a test's fault hook may stand in between).
Write = Callable[[Sequence[Op]], Awaitable[None]]


@dataclass(frozen=True)
class StoredState:
    leases: list[LeaseRecord]
    cooldowns: list[CooldownRecord]
    last_used: dict[str, float]


__all__ = [
    "AddRefusals",
    "AddReport",
    "CooldownRecord",
    "EndLease",
    "ForgetProxy",
    "LeaseRecord",
    "Op",
    "Prune",
    "PutCooldown",
    "PutLease",
    "ReportRecord",
    "StoredState",
    "Touch",
    "Write",
]
