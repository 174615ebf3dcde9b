"""The SQLite book's part of the autopilot's signals (discovery/book/signals.py):
refused grants recorded, and the counts read back.

A refusal is written straight to the store, not through the book's write
(nor a test's hook on it), and the 409 does not wait for it: it changes no
lease, and a refusal that cannot be recorded must not turn into another
answer. At most MAX_IN_FLIGHT refusals wait for their commit at once (a disk
that stalls under a flood of 409s holds no more memory than that); those
beyond are not recorded, and the log says how many once the disk is back."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from discovery.book.errors import StoreError
from discovery.book.signals import SignalCounts
from discovery.logs import event
from discovery.sqlite.ops import AddRefusals
from discovery.sqlite.store import SqliteStore

log = logging.getLogger("discovery.store")

MAX_IN_FLIGHT = 1024


class Tally:
    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._in_flight = 0
        self._dropped = 0

    def refused(self, at: float, groups: list[str], holder: str) -> None:
        """Records a grant refused at `at` for each of `groups`; does not wait."""
        if not groups:
            return
        if self._in_flight >= MAX_IN_FLIGHT:
            self._dropped += 1
            return
        try:
            future = self._store.write((AddRefusals(at, tuple(groups), holder),))
        except StoreError:  # closed: the service is stopping
            return
        self._in_flight += 1
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[None]) -> None:
        self._in_flight -= 1
        if future.cancelled() or future.exception() is not None:
            return  # the store logged it; the refusal is not counted
        if self._dropped and self._in_flight == 0:
            event(
                log,
                logging.WARNING,
                "refusals not recorded: too many waited for the disk",
                dropped=self._dropped,
            )
            self._dropped = 0

    async def count(self, now: float, window: float) -> SignalCounts:
        """The counts after `now - window`, with every refusal queued before
        this call committed first (a write of nothing waits its turn behind
        them), so a client reads its own 409s."""
        with contextlib.suppress(StoreError):  # failing writes: read what is there
            await self._store.write(())
        return await self._store.count_signals(now, window)


__all__ = ["MAX_IN_FLIGHT", "Tally"]
