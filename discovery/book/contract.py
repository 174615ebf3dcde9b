"""The lease book: what the HTTP layer, the hot path, the status page and the
service's background work may ask of a store. Two implementations keep it,
discovery.sqlite.SqliteBook and discovery.postgres.PostgresBook, and one
test suite holds both to it (tests/integration/test_lease_rules.py).

Every operation raises only what discovery/book/errors.py declares:
LeaseNotFound (404), NoProxyAvailable (409), StoreUnavailable (503).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from discovery.book.signals import SignalCounts
from discovery.fleet import Fleet, FleetProxy
from discovery.health_source import HealthSource
from discovery.metrics import Metrics, StateSnapshot
from discovery.selection import Selector
from health.model import Health

Outcome = Literal["ok", "blocked", "error"]


@dataclass(slots=True)
class Lease:
    id: str
    proxy: FleetProxy
    holder: str
    target: str | None  # host name the lease was asked for
    ttl: float
    granted_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A lease as a store keeps it: its proxy by name."""

    id: str
    proxy: str
    holder: str
    target: str | None
    ttl: float
    granted_at: float
    expires_at: float


@dataclass(frozen=True)
class FleetChange:
    added: list[str]
    removed: list[str]
    changed: list[str]
    revoked: int


class LeaseBook(Protocol):
    """Both implementations split the same way: the book decides (with the
    rules of discovery/book/rules.py) and its store only reads and writes."""

    # -- the API's operations: on leases of proxies in this service's fleet only --------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        """The least recently used healthy, free proxy the selector matches that
        cools down neither everywhere nor for `host` (never used ones first, by
        name); NoProxyAvailable saying why none is."""
        ...

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        """A live lease's end moved to now + ttl (its own TTL when None; capped)."""
        ...

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        """Records a crawler's report: `blocked` cools the proxy down (for
        `host`, else everywhere), each `error` counts as a failed probe."""
        ...

    async def release(self, lease_id: str) -> None: ...

    async def cooling(self, lease_id: str, host: str) -> bool:
        """Whether the proxy of a live lease cools down for `host` or everywhere
        (a holder that uses one lease for several sites asks before each new
        site: a proxy cooling down for a site is never used for it)."""
        ...

    # -- background work -------------------------------------------------------------------

    async def expire_due(self) -> int:
        """Ends the leases past their time; returns how many (each counted once)."""
        ...

    def next_expiry(self) -> float | None:
        """When expire_due has work next, if the book knows (None: poll)."""
        ...

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        """Switches to a new fleet: leases of proxies that stay are kept, those
        of proxies that left end (404 at once), with their cooldowns."""
        ...

    def on_health_change(self, name: str, health: Health) -> None:
        """The health engine's news about one proxy."""
        ...

    async def maintain(self) -> None:
        """The periodic tidy-up: ended cooldowns, old reports, repairs."""
        ...

    # -- views ---------------------------------------------------------------------------

    async def proxies_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """The fleet as `GET /v1/proxies` shows it; `detail` adds each lease's
        holder and end and the recent probe times (the status page)."""
        ...

    async def signals(self, window: float) -> SignalCounts:
        """The store's counts over the last `window` seconds of its clock
        (discovery/book/signals.py): `blocked` reports per proxy with their
        distinct targets, and grants refused (409) per proxy group their
        selector matched (each a grant refused for every group it matched;
        one matching no proxy counts for none). Counted from what the store
        keeps, so every replica of a shared store answers alike; a grant
        refused by this book is counted once this returns."""
        ...

    async def refresh_snapshot(self) -> None:
        """Brings snapshot() up to date (before a metrics scrape)."""
        ...

    def snapshot(self) -> StateSnapshot:
        """The gauges' figures as of the last refresh_snapshot()."""
        ...


class StoreBackend(Protocol):
    """A store's part in the running service (discovery/service.py): how it
    opens, builds its book and stops, and what it runs in the background."""

    expiry_tick: float  # the longest the service's sweep sleeps

    def describe(self) -> str:
        """What the store is, for the log: never a password."""
        ...

    def open(self) -> None:
        """Before the server starts: lock, read or migrate; StoreError."""
        ...

    async def start(self, fleet: Fleet, health: HealthSource, metrics: Metrics) -> LeaseBook: ...

    def loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        """Background work of the store's own, by name."""
        ...

    def failure(self) -> str | None:
        """Why the store cannot write now (readiness; shown to clients, so it
        never names a server); None when it can."""
        ...

    async def stop(self) -> None: ...

    def close(self) -> None:
        """Frees what open() took, when stop() did not run (a failed start)."""
        ...


__all__ = ["FleetChange", "Lease", "LeaseBook", "LeaseRecord", "Outcome", "StoreBackend"]
