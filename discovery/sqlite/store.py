"""The SQLite lease store: embedded SQLite, WAL, every commit fsynced (durable).

The service keeps the live state in memory (see book.py) and writes every
change here before it answers, so a `kill -9` loses no granted lease,
renewal, cooldown or report. Writes go through one writer thread that
commits whatever has queued up in one transaction (group commit): with
`synchronous=FULL` each commit costs an fsync, and batching is what lets
thousands of grants per second through one fsync at a time.

Only one service may own a store: an exclusive lock on `<db>.lock` is held
for as long as it is open. The schema version is SQLite's `user_version`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from discovery.book.errors import StoreError
from discovery.book.signals import BanCount, RefusalCount, SignalCounts
from discovery.logs import event
from discovery.sqlite.ops import CooldownRecord, LeaseRecord, Op, StoredState
from discovery.sqlite.schema import BANS, MIGRATIONS, REFUSALS, SCHEMA_VERSION, execute

log = logging.getLogger("discovery.store")

_MAX_BATCH = 2048  # submissions per transaction

_Done = Callable[[BaseException | None], None]
_STOP = object()


class SqliteStore:
    """Open with :meth:`open`; write with :meth:`write` (awaitable, durable when it returns)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_file: IO[bytes] | None = None
        self._db: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.on_commit: Callable[[int, float], None] | None = None  # (ops, seconds), for metrics
        # Why the last transaction failed; None once one commits again (readiness).
        self.failure: str | None = None
        # Reads that count over many rows (GET /v1/signals) run on a connection
        # of their own, in a worker thread, one at a time: WAL lets them read
        # what is committed while the writer goes on.
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> StoredState:
        """Lock, migrate and read the store; starts the writer thread."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock_file = lock_path.open("ab")
        except OSError as exc:  # a read-only file system, no permission, ...
            where = exc.filename or self.path.parent
            raise StoreError(f"{self.path}: cannot create {where}: {exc.strerror}") from None
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise StoreError(
                f"{self.path} is in use by another discovery service (lock {lock_path})"
            ) from None
        self._lock_file = lock_file
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db = db
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = FULL")
            db.execute("PRAGMA foreign_keys = ON")
            self._migrate(db)
            state = self._read(db)
            self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            self.close()
            raise StoreError(f"{self.path}: {exc}") from None
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._writer, name="discovery-store", daemon=True)
        self._thread.start()
        return state

    def close(self) -> None:
        """Finishes every queued write, then closes the database and drops the lock."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        if self._db is not None:
            self._db.close()
            self._db = None
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store schema version {version} is newer than this service knows "
                f"({SCHEMA_VERSION}); run the newer service or restore a backup"
            )
        for target in range(version, SCHEMA_VERSION):
            db.execute("BEGIN IMMEDIATE")
            # executescript would COMMIT first; run the statements one by one inside
            # the transaction so a migration is all or nothing.
            try:
                for statement in MIGRATIONS[target]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target + 1}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            event(log, logging.INFO, "store migrated", version=target + 1)

    @staticmethod
    def _read(db: sqlite3.Connection) -> StoredState:
        leases = [
            LeaseRecord(*row)
            for row in db.execute(
                "SELECT id, proxy, holder, target, ttl, granted_at, expires_at FROM leases"
            )
        ]
        cooldowns = [
            CooldownRecord(*row) for row in db.execute("SELECT proxy, target, until FROM cooldowns")
        ]
        last_used = dict(db.execute("SELECT proxy, last_used FROM usage").fetchall())
        return StoredState(leases, cooldowns, last_used)

    # -- reading -------------------------------------------------------------------------

    async def count_signals(self, now: float, window: float) -> SignalCounts:
        """The `blocked` reports per proxy and the refused grants per group
        after `now - window` (discovery/book/signals.py), as committed."""
        return await asyncio.to_thread(self._count_signals, now, window)

    def _count_signals(self, now: float, window: float) -> SignalCounts:
        since = now - window
        with self._read_lock:
            db = self._reader
            if db is None:
                raise StoreError("the store is closed")
            try:
                db.execute("BEGIN")  # one snapshot for both counts
                try:
                    bans = [BanCount(*row) for row in db.execute(BANS, (since,))]
                    refusals = [RefusalCount(*row) for row in db.execute(REFUSALS, (since,))]
                finally:
                    db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from None
        return SignalCounts(now, window, bans, refusals)

    # -- writing -------------------------------------------------------------------------

    def write(self, ops: Sequence[Op]) -> asyncio.Future[None]:
        """Queue `ops` as one unit; the future resolves once they are committed.

        Call from the event loop. Units are committed in the order they were
        queued, so the caller's in-memory order of changes is the store's.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def done(error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        if self._thread is None:
            raise StoreError("the store is closed")
        self._queue.put((ops, loop, done))
        return future

    def _writer(self) -> None:
        _name_os_thread(b"discovery-store")
        db = self._db
        assert db is not None
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._commit_batch(db, batch)  # type: ignore[arg-type]
            if stop:
                return

    def _commit_batch(
        self,
        db: sqlite3.Connection,
        batch: list[tuple[Sequence[Op], asyncio.AbstractEventLoop, _Done]],
    ) -> None:
        results: list[tuple[_Done, BaseException | None]]
        try:
            self._commit(db, [ops for ops, _, _ in batch])
            results = [(done, None) for _, _, done in batch]
            self.failure = None
        except sqlite3.Error:
            # One bad unit must not fail the others: retry each on its own.
            results = []
            for ops, _, done in batch:
                try:
                    self._commit(db, [ops])
                    results.append((done, None))
                    self.failure = None
                except sqlite3.Error as exc:
                    event(log, logging.ERROR, "store write failed", error=str(exc))
                    results.append((done, StoreError(str(exc))))
                    self.failure = str(exc)
        loops: dict[asyncio.AbstractEventLoop, list[tuple[_Done, BaseException | None]]] = {}
        for (_, loop, _), result in zip(batch, results, strict=True):
            loops.setdefault(loop, []).append(result)
        for loop, items in loops.items():
            # One wake-up of the event loop per batch, not per request.
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve_all, items)

    def _commit(self, db: sqlite3.Connection, units: Sequence[Sequence[Op]]) -> None:
        start = time.perf_counter()
        count = 0
        db.execute("BEGIN IMMEDIATE")
        try:
            for ops in units:
                for op in ops:
                    execute(db, op)
                    count += 1
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if self.on_commit is not None:
            self.on_commit(count, time.perf_counter() - start)


def _name_os_thread(name: bytes) -> None:
    """Names the thread for the OS too (`top -H`, /proc/PID/task/*/comm), so the
    writer's CPU shows apart from the event loop's. Best effort; Linux only."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name[:15], 0, 0, 0)  # PR_SET_NAME


def _resolve_all(items: list[tuple[_Done, BaseException | None]]) -> None:
    for done, error in items:
        done(error)


__all__ = ["SqliteStore"]
