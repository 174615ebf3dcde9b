"""Each replica's own connection to the database, outside the pool: it says
whether the database can be reached, and one replica at a time probes the
proxies through it.

Reachability (readiness): a statement on this connection every round (at
most a second apart), answered within CHECK_TIMEOUT_S, or the database is
unreachable (`PostgresStore.failure`) until one is answered again. Not the
pool's: a busy replica's requests fill its pool while the database answers
at once, and that is load (store.py), not an outage.

Probing: the replica holding a session advisory lock on this connection
runs the health engine. It probes its own fleet and the proxies only other
replicas' fleets hold (read from the database, which holds how to reach
them: fleets.py), so every proxy any replica serves is probed, once per
interval by the whole set. It writes what its engine sees into the proxies'
rows, which every replica reads for grants and `GET /v1/proxies`, and hands
crawlers' `error` reports (each one) to its engine; that work runs on a
second connection of its own, so neither a busy pool nor a slow write delays
the check. When the leader dies, PostgreSQL drops its connection and with it
the lock; another replica takes the lock at its next try (at most half a
probe interval later) and probes from then on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any, LiteralString

import psycopg

from discovery.book.errors import StoreError
from discovery.book.rules import round_latency
from discovery.health_source import HealthSource
from discovery.logs import event
from discovery.postgres.rows import HealthView
from discovery.postgres.store import PostgresStore
from health.model import Health, ProxyEndpoint

log = logging.getLogger("discovery.shared")

LEADER_LOCK = 0x6567_7265_7374  # held by the replica that runs the health probes
FLUSH_S = 1.0  # how often the leader writes health changes and reads error reports
CHECK_TIMEOUT_S = 5.0  # a check unanswered this long: the database is unreachable
NAMES_LOGGED = 20  # foreign proxies named in the log line, of however many


class Leadership:
    def __init__(
        self, store: PostgresStore, engine: HealthSource, *, probe_interval: float
    ) -> None:
        self._store = store
        self._engine = engine
        self._retry = max(0.2, min(1.0, probe_interval / 2))
        self._written: dict[str, HealthView] = {}
        self._own: dict[str, ProxyEndpoint] = {}  # this replica's fleet
        self._foreign: dict[str, ProxyEndpoint] = {}  # only other fleets': probed while leading
        self._probed: list[ProxyEndpoint] | None = None  # what the engine was last given
        self._work: psycopg.AsyncConnection[Any] | None = None
        self._syncing = asyncio.Lock()  # one round at a time on the work connection
        self._work_error: str | None = None
        self.leading = False

    # -- what the engine probes ------------------------------------------------------------

    def serve(self, endpoints: Iterable[ProxyEndpoint]) -> None:
        """This replica's fleet (the book's, at start and at each change)."""
        self._own = {e.name: e for e in endpoints}
        self._push()

    def _push(self) -> None:
        probed = [*self._own.values()]
        probed += [e for name, e in self._foreign.items() if name not in self._own]
        if probed != self._probed:
            self._engine.set_fleet(probed)
            self._probed = probed

    # -- the replica's own connection: reachability and the lock ---------------------------

    async def run(self) -> None:
        """Checks the database and tries for the lock every round, leads while
        it holds it; reconnects when the connection fails; forever (cancelled
        at stop)."""
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self._store.connect_alone()
                await self._watch(conn)
            except (StoreError, psycopg.Error) as error:
                self._store.failure = str(error).splitlines()[0] if str(error) else "no answer"
                event(log, logging.WARNING, "database not reachable", error=str(error))
            finally:
                await self._stop_leading()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(self._retry)

    async def _watch(self, conn: psycopg.AsyncConnection[Any]) -> None:
        work: asyncio.Task[None] | None = None
        try:
            while True:
                if self.leading:
                    await self._ask(conn, "SELECT true")  # the lock lives as long as this
                    await asyncio.sleep(FLUSH_S)
                    continue
                if await self._ask(conn, "SELECT pg_try_advisory_lock(%s)", LEADER_LOCK):
                    self.leading = True
                    event(log, logging.INFO, "leading: this replica probes the fleet")
                    await self._engine.start()
                    work = asyncio.get_running_loop().create_task(self._lead())
                    continue
                await asyncio.sleep(self._retry)
        finally:
            if work is not None:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work

    async def _ask(
        self, conn: psycopg.AsyncConnection[Any], sql: LiteralString, *params: Any
    ) -> bool:
        """One check: `sql`'s boolean, answered within CHECK_TIMEOUT_S. The
        database counts as reachable from then on."""

        async def fetch() -> bool:
            row = await (await conn.execute(sql, params or None)).fetchone()
            return bool(row and row[0])

        task = asyncio.ensure_future(fetch())
        done, _ = await asyncio.wait({task}, timeout=CHECK_TIMEOUT_S)
        if not done:
            # Unreachable now, not once psycopg's cancellation gives up (up to 10 s more).
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            task.cancel()
            raise StoreError(f"no answer from the database in {CHECK_TIMEOUT_S:g} s")
        answer = task.result()
        self._store.failure = None
        return answer

    async def _stop_leading(self) -> None:
        if not self.leading:
            return
        self.leading = False
        self._foreign = {}
        self._push()
        await self._engine.stop()
        await self._close_work()
        event(log, logging.INFO, "stopped probing (no longer the leader)")

    # -- the leader's work, on a second connection -----------------------------------------

    async def _lead(self) -> None:
        self._written = {}
        while True:
            try:
                await self.sync()
                if self._work_error is not None:
                    event(log, logging.INFO, "the leader's writes go through again")
                    self._work_error = None
            except StoreError as error:
                # Logged once per reason: the check says whether the database is there.
                if str(error) != self._work_error:
                    event(log, logging.WARNING, "the leader's writes failed", error=str(error))
                    self._work_error = str(error)
            await asyncio.sleep(FLUSH_S)

    async def sync(self) -> None:
        """One round of the leader's work: the proxies only other fleets hold
        in, health changes out, error reports in."""
        async with self._syncing:
            await self._sync()

    async def _sync(self) -> None:
        try:
            if self._work is None or self._work.closed:
                self._work = await self._store.connect_alone()
            conn = self._work
            await self._refresh_foreign(conn)
            await self._flush(conn)
            for row in await self._store.take_error_reports(conn):
                for _ in range(row.count):
                    self._engine.report_error(row.proxy, row.error)
        except psycopg.Error as error:
            await self._close_work()
            raise StoreError(str(error).splitlines()[0] if str(error) else "failed") from None

    async def close(self) -> None:
        await self._close_work()

    async def _close_work(self) -> None:
        conn, self._work = self._work, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _refresh_foreign(self, conn: psycopg.AsyncConnection[Any]) -> None:
        rows = await self._store.foreign_proxies(conn)
        foreign = {
            r.name: ProxyEndpoint(r.name, r.host, r.port, r.username, r.password)
            for r in rows
            if r.name not in self._own
        }
        if foreign.keys() != self._foreign.keys():
            names = sorted(foreign)
            more = ", ..." if len(names) > NAMES_LOGGED else ""
            event(
                log,
                logging.INFO,
                "probing proxies that only other replicas serve",
                count=len(names),
                proxies=", ".join(names[:NAMES_LOGGED]) + more,
            )
        self._foreign = foreign
        self._push()

    async def _flush(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Writes every proxy whose view changed since the last flush. A proxy
        not probed yet (a leader just taking over) keeps what the last one wrote."""
        rows: list[tuple[str, HealthView]] = []
        written = self._written
        for state in self._engine.all():
            if state.health == Health.UNKNOWN:
                continue
            view = HealthView(
                str(state.health),
                round_latency(state.latency_ms),
                state.last_error,
                state.recent_ms,
            )
            if written.get(state.name) != view:
                rows.append((state.name, view))
        changed = sum(
            1 for name, view in rows if name not in written or written[name].health != view.health
        )
        await self._store.write_health(conn, rows, health_changes=changed)
        written.update(rows)


__all__ = ["CHECK_TIMEOUT_S", "LEADER_LOCK", "Leadership"]
