"""One replica at a time probes the fleet: the one holding a session advisory
lock on a connection of its own. It writes what its health engine sees into
the proxies' rows, which every replica reads for grants and `GET
/v1/proxies`, and hands crawlers' `error` reports (each one) to its engine.
When it dies, PostgreSQL drops its connection and with it the lock; another
replica takes the lock at its next try (at most half a probe interval
later) and probes from then on, so each proxy is probed about once per
interval by the whole set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from discovery.book.errors import StoreError
from discovery.book.rules import round_latency
from discovery.health_source import HealthSource
from discovery.logs import event
from discovery.postgres.rows import HealthView
from discovery.postgres.store import PostgresStore
from health.model import Health

log = logging.getLogger("discovery.shared")

LEADER_LOCK = 0x6567_7265_7374  # held by the replica that runs the health probes
FLUSH_S = 1.0  # how often the leader writes health changes and reads error reports


class Leadership:
    def __init__(
        self, store: PostgresStore, engine: HealthSource, *, probe_interval: float
    ) -> None:
        self._store = store
        self._engine = engine
        self._retry = max(0.2, min(1.0, probe_interval / 2))
        self._written: dict[str, HealthView] = {}
        self.leading = False

    async def run(self) -> None:
        """Tries for the lock until it is taken, leads until its connection
        is lost, then tries again; forever (cancelled at stop)."""
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self._store.connect_alone()
                await self._acquire(conn)
                await self._lead(conn)
            except (StoreError, psycopg.Error) as error:
                event(log, logging.WARNING, "leadership lost or not reachable", error=str(error))
            finally:
                if self.leading:
                    self.leading = False
                    await self._engine.stop()
                    event(log, logging.INFO, "stopped probing (no longer the leader)")
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(self._retry)

    async def _acquire(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,))
            row = await cur.fetchone()
            if row is not None and row[0]:
                return
            await asyncio.sleep(self._retry)

    async def _lead(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.leading = True
        self._written = {}
        event(log, logging.INFO, "leading: this replica probes the fleet")
        await self._engine.start()
        while True:
            await self.sync()
            await conn.execute("SELECT 1")  # the lock lives as long as this connection
            await asyncio.sleep(FLUSH_S)

    async def sync(self) -> None:
        """One round of the leader's work: health changes out, error reports in."""
        await self._flush()
        for row in await self._store.take_error_reports():
            for _ in range(row.count):
                self._engine.report_error(row.proxy, row.error)

    async def _flush(self) -> None:
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
        await self._store.write_health(rows, health_changes=changed)
        written.update(rows)


__all__ = ["LEADER_LOCK", "Leadership"]
