"""Statements PostgreSQL aborted to break a deadlock (or a serialization
conflict), run again.

Why: a grant batch locks proxies then writes their lease rows; a release
batch and the expiry sweep end lease rows then write their proxies. Under
load a cycle between them forms now and then; PostgreSQL finds it after
`deadlock_timeout` (1 s) and aborts one statement, which ended every request
of that batch with a 503 (128 releases at once, seen in
`bench/discovery_leases.py`-style runs: "deadlock detected"). The aborted
statement changed nothing, so running it again is exact; PostgreSQL's own
advice is to retry such transactions.

Invariant: `retrying` runs WORK at most ATTEMPTS times and only again after
a StoreConflict; any other error, and the last conflict, go to the caller."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from discovery.book.errors import StoreError
from discovery.logs import event

log = logging.getLogger("discovery.pgstore")
T = TypeVar("T")
ATTEMPTS = 3


class StoreConflict(StoreError):
    """The database aborted the statement to break a deadlock or a
    serialization conflict: it changed nothing and may run again."""


async def retrying(work: Callable[[], Awaitable[T]], attempts: int = ATTEMPTS) -> T:
    for attempt in range(1, attempts + 1):
        try:
            return await work()
        except StoreConflict as conflict:
            if attempt == attempts:
                raise
            event(
                log,
                logging.INFO,
                "statement run again: the database aborted it to break a conflict",
                error=str(conflict),
                attempt=attempt + 1,
            )
    raise AssertionError("unreachable")  # the loop returns or raises


__all__ = ["ATTEMPTS", "StoreConflict", "retrying"]
