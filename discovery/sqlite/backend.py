"""The SQLite store in the running service: the file is locked and read
before the server starts; while it fails its writes, a write that changes
nothing is tried every STORE_PROBE_S so that readiness comes back by itself.

The wiring production runs and the tests run alike: a test gives a clock
and, to fail or hold the book's writes, a hook that stands between the
book and the store's write (tests/support/lease_world.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from discovery.book.contract import LeaseBook
from discovery.book.errors import StoreError
from discovery.book.rules import Terms
from discovery.fleet import Fleet
from discovery.health_source import HealthSource
from discovery.metrics import Metrics
from discovery.sqlite.book import SqliteBook
from discovery.sqlite.ops import StoredState, Touch, Write
from discovery.sqlite.store import SqliteStore
from discovery.sqlite.tally import Tally

STORE_PROBE_S = 1.0

# Given the store's write, what the book writes through instead.
WriteHook = Callable[[Write], Write]


class SqliteBackend:
    expiry_tick = 0.25  # longest a lease outlives its expiry before it is swept

    def __init__(
        self,
        path: Path,
        terms: Terms,
        clock: Callable[[], float] = time.time,
        *,
        write_hook: WriteHook | None = None,
    ) -> None:
        self._terms = terms
        self._clock = clock
        self._write_hook = write_hook
        self.store = SqliteStore(path)
        self._state: StoredState | None = None

    def describe(self) -> str:
        return f"sqlite {self.store.path}"

    def open(self) -> None:
        if self._state is None:
            self._state = self.store.open()

    async def start(self, fleet: Fleet, health: HealthSource, metrics: Metrics) -> LeaseBook:
        self.open()
        assert self._state is not None
        self.store.on_commit = metrics.on_commit
        write: Write = self.store.write
        if self._write_hook is not None:
            write = self._write_hook(write)
        book = SqliteBook(
            write=write,
            health=health,
            metrics=metrics,
            terms=self._terms,
            clock=self._clock,
            tally=Tally(self.store),
        )
        await book.restore(self._state, fleet)
        self._state = None  # the book owns it now
        await health.start()  # one service: it probes from the start
        return book

    def loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {"store probe": self._probe_loop}

    def failure(self) -> str | None:
        return self.store.failure

    async def stop(self) -> None:
        # close() waits for the writer thread to commit what is queued.
        await asyncio.to_thread(self.store.close)

    def close(self) -> None:
        self.store.close()

    async def _probe_loop(self) -> None:
        """While the store fails, tries it with a write that changes nothing:
        readiness must come back once it can write, with or without traffic."""
        while True:
            await asyncio.sleep(STORE_PROBE_S)
            if self.store.failure is not None:
                with contextlib.suppress(StoreError):
                    await self.store.write((Touch(),))


__all__ = ["STORE_PROBE_S", "SqliteBackend", "WriteHook"]
