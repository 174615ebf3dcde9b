"""The autopilot's two seams to the world, as small interfaces: the stack
(its config file, its state, its updates) and the clock. The round logic
(run.py) sees only these; the real stack is Pulumi's Automation API
(automation.py), the unit tests' a fake that records what it was asked.

Why a seam of its own: one Pulumi operation at a time, a config edit undone
when its update fails, the lock waited for and never broken are rules of the
round, and they are tested with a fake stack and a fake clock, without
seconds of `pulumi up` per case.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class DeployedResource:
    """One resource of the stack's state, as much as targeting needs."""

    urn: str
    type: str
    parent: str | None = None
    created: datetime | None = None  # when the engine first made it (state's `created`)
    provider: str | None = None  # its provider reference (state's `provider`: URN::ID)


@dataclass(frozen=True)
class Deployed:
    """What the stack holds: its config file's ``egress-proxies:*`` keys
    (without the namespace) and its resources."""

    config: Mapping[str, Any]
    resources: Sequence[DeployedResource]


@dataclass(frozen=True)
class Updated:
    """A finished update: its number in `pulumi stack history` (a file
    backend numbers none: then its ordinal there, oldest 1), when it
    started, and what it changed, by operation."""

    id: int | None
    changes: Mapping[str, int]
    started: str | None = None


class StackBusy(Exception):
    """Another operation holds the stack's lock; ``holder`` says whose when
    the backend tells (a lock file's user, host and pid)."""

    def __init__(self, holder: str | None) -> None:
        super().__init__(f"the stack is locked by {holder or 'another operation'}")
        self.holder = holder


class UpdateFailed(Exception):
    """The update ran and failed; its text is the engine's last lines (no
    secret: the Automation API shows none unless asked)."""


class StackUnavailable(Exception):
    """The stack could not be opened or read at all (no pulumi CLI, no such
    stack, a backend that does not answer): the cause in one line."""


class Stack(Protocol):
    name: str

    def read(self) -> Deployed:
        """The config file and the state now (no lock taken)."""

    def set_config(self, path: str, value: int | None) -> None:
        """Sets ``egress-proxies:<path>`` (a Pulumi config path such as
        ``generations.home-0`` or ``proxies[0].replicas``) in the stack's
        config file; None removes it."""

    def lock_holder(self) -> str | None:
        """Who holds the stack's lock now (user@host, pid), '' when it is held
        by someone the backend does not name, None when it is free or the
        backend cannot tell (then `update` finds out)."""

    def update(
        self,
        message: str,
        targets: Sequence[str],
        registers: Sequence[str],
        *,
        checkpoints: bool = True,
    ) -> Updated:
        """`pulumi up` of TARGETS only (URNs, wildcards allowed) with MESSAGE,
        the program registering only the replicas REGISTERS names
        (proxyinfra/partial.py); the state written after each step unless
        CHECKPOINTS is False and the operator did not say otherwise; raises
        StackBusy when the lock is held, UpdateFailed when it fails."""

    def refresh(self, targets: Sequence[str]) -> None:
        """`pulumi refresh` of TARGETS only (URNs: resources and the
        providers they need); raises StackBusy when the lock is held,
        UpdateFailed when it fails."""


class Clock(Protocol):
    def now(self) -> datetime:
        """An aware datetime."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
