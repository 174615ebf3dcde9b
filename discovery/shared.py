"""Leases and health shared by several replicas through PostgreSQL.

:class:`SharedLeaseBook` answers the API from the database (discovery/
pgstore.py): any replica can renew, report or release a lease another one
granted, and the refusal (409) is computed from the database's view.

:class:`Leadership`: one replica at a time probes the fleet, the one holding
a session advisory lock on a connection of its own. It writes what its
health engine sees into the proxies' rows, which every replica reads for
grants and `GET /v1/proxies`, and hands crawlers' `error` reports to its
engine. When it dies, PostgreSQL drops its connection and with it the lock;
another replica takes the lock at its next try (at most half a probe
interval later) and probes from then on, so each proxy is probed about once
per interval by the whole set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import psycopg

from discovery.fleet import Fleet, FleetProxy
from discovery.health_source import HealthSource
from discovery.leases import (
    FleetChange,
    Lease,
    LeaseNotFound,
    Outcome,
    ProxyDetail,
    StoreUnavailable,
    _LeaseIds,
    lease_json,
    proxy_json,
    refusal,
    taking_turns,
)
from discovery.logs import event
from discovery.metrics import Metrics, StateSnapshot
from discovery.pgstore import LEADER_LOCK, HealthView, LeaseRow, PgStore
from discovery.selection import Selector
from discovery.store import StoreError
from health.model import Health

log = logging.getLogger("discovery.shared")

T = TypeVar("T")
FLUSH_S = 1.0  # how often the leader writes health changes and reads error reports


class SharedLeaseBook:
    def __init__(
        self,
        *,
        store: PgStore,
        health: HealthSource,
        metrics: Metrics,
        max_ttl: float,
        cooldown: float,
        probe_interval: float,
    ) -> None:
        self._store = store
        self._health = health
        self._metrics = metrics
        self.max_ttl = max_ttl
        self.cooldown = cooldown
        self._probe_interval = probe_interval
        self._fleet: dict[str, FleetProxy] = {}
        self._new_id = _LeaseIds()
        self._snapshot = StateSnapshot(0, 0, {str(h): 0 for h in Health})

    # -- fleet ---------------------------------------------------------------------------

    async def restore(self, fleet: Fleet) -> None:
        """Registers this replica's fleet (adds and updates; removes nothing:
        another replica may already serve a newer fleet)."""
        self._fleet = dict(fleet.proxies)
        await self._call(self._store.sync_fleet(self._fleet.values(), ()))
        self._health.set_fleet(p.endpoint() for p in self._fleet.values())
        event(log, logging.INFO, "fleet registered in the shared store", proxies=len(self._fleet))

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        old, new = self._fleet, dict(fleet.proxies)
        removed = [name for name in old if name not in new]
        added = [name for name in new if name not in old]
        changed = [name for name in new if name in old and new[name] != old[name]]
        revoked = await self._call(self._store.sync_fleet(new.values(), removed))
        self._fleet = new
        self._health.set_fleet(p.endpoint() for p in new.values())
        self._metrics.revoked.inc(revoked)
        return FleetChange(added, removed, changed, revoked)

    async def register_fleet(self) -> None:
        """Writes this replica's fleet again (a guard against a replica with an
        older fleet that removed proxies this one still serves)."""
        await self._call(self._store.sync_fleet(self._fleet.values(), ()))

    # -- the API's operations ------------------------------------------------------------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        lifetime = self.max_ttl if ttl is None else min(ttl, self.max_ttl)
        for _ in range(3):
            row = await self._call(
                self._store.grant(self._new_id(), holder, lifetime, host, selector)
            )
            if row is None:
                now, candidates = await self._call(self._store.candidates(selector, host))
                denial = refusal(candidates, host, now, self._probe_interval)
                self._metrics.denied.labels(denial.reason).inc()
                raise denial
            if row.proxy in self._fleet:
                break
            # A proxy of another replica's newer fleet that this one cannot
            # hand out (no address yet): give it back and pick again.
            await self._call(self._store.release(row.id))
        else:
            raise StoreUnavailable("this replica's fleet is behind the shared store's")
        self._metrics.grant()
        event(log, logging.DEBUG, "lease granted", lease=row.id, proxy=row.proxy, holder=holder)
        return self._lease(row)

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        row = await self._call(self._store.renew(lease_id, ttl, self.max_ttl))
        if row is None or row.proxy not in self._fleet:
            raise LeaseNotFound(lease_id)
        return self._lease(row)

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        found = await self._call(self._store.report(lease_id, outcome, host, self.cooldown))
        if found is None:
            raise LeaseNotFound(lease_id)
        lease, scope, until = found
        if until is not None:
            event(
                log,
                logging.INFO,
                "proxy cooling down",
                proxy=lease.proxy,
                target=scope,
                until=until,
            )
        self._metrics.reports.labels(outcome).inc()

    async def release(self, lease_id: str) -> None:
        proxy = await self._call(self._store.release(lease_id))
        if proxy is None:
            raise LeaseNotFound(lease_id)
        self._metrics.released.inc()
        event(log, logging.DEBUG, "lease released", lease=lease_id, proxy=proxy)

    async def expire_due(self) -> int:
        ended = await self._call(self._store.expire())
        self._metrics.expired.inc(ended)
        return ended

    # -- views ---------------------------------------------------------------------------

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        return lease_json(lease)

    async def proxies_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """The fleet as the database sees it: the same answer on every replica
        (`detail`: as LeaseBook.proxies_json)."""
        now, rows = await self._call(self._store.proxies())
        answer = []
        async for name, proxy in taking_turns(list(self._fleet.items())):
            row = rows.get(name)
            answer.append(
                proxy_json(
                    proxy,
                    health=row.health if row else str(Health.UNKNOWN),
                    latency_ms=row.latency_ms if row else None,
                    last_error=row.last_error if row else None,
                    leased=bool(row and row.leased),
                    cooldowns=[(u, t) for t, u in (row.cooldowns if row else ()) if u > now],
                    detail=ProxyDetail(row.lease if row else None, row.recent_ms if row else ())
                    if detail
                    else None,
                )
            )
        return answer

    async def refresh_snapshot(self) -> None:
        """The gauges' figures (read by /metrics without a query)."""
        now, rows = await self._call(self._store.proxies())
        by_health = {str(h): 0 for h in Health}
        leased = cooling = 0
        for name in self._fleet:
            row = rows.get(name)
            by_health[row.health if row else str(Health.UNKNOWN)] += 1
            if row:
                leased += row.leased
                cooling += sum(1 for _t, until in row.cooldowns if until > now)
        self._snapshot = StateSnapshot(leased, cooling, by_health)

    def snapshot(self) -> StateSnapshot:
        return self._snapshot

    # -- internals -----------------------------------------------------------------------

    def _lease(self, row: LeaseRow) -> Lease:
        proxy = self._fleet.get(row.proxy)
        if proxy is None:
            raise LeaseNotFound(row.id)
        return Lease(row.id, proxy, row.holder, row.target, row.ttl, row.granted_at, row.expires_at)

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except StoreError as error:
            event(log, logging.ERROR, "shared store unavailable", error=str(error))
            raise StoreUnavailable(f"the lease store is unavailable: {error}") from None


class Leadership:
    def __init__(self, store: PgStore, engine: HealthSource, *, probe_interval: float) -> None:
        self._store = store
        self._engine = engine
        self._retry = max(0.2, min(1.0, probe_interval / 2))
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
        event(log, logging.INFO, "leading: this replica probes the fleet")
        await self._engine.start()
        written: dict[str, HealthView] = {}
        while True:
            await self._flush(written)
            for name, error in await self._store.take_error_reports():
                self._engine.report_error(name, error)
            await conn.execute("SELECT 1")  # the lock lives as long as this connection
            await asyncio.sleep(FLUSH_S)

    async def _flush(self, written: dict[str, HealthView]) -> None:
        """Writes every proxy whose view changed since the last flush. A proxy
        not probed yet (a leader just taking over) keeps what the last one wrote."""
        rows: list[tuple[str, HealthView]] = []
        for state in self._engine.all():
            if state.health == Health.UNKNOWN:
                continue
            latency = round(state.latency_ms, 1) if state.latency_ms is not None else None
            view = HealthView(str(state.health), latency, state.last_error, state.recent_ms)
            if written.get(state.name) != view:
                rows.append((state.name, view))
        changed = sum(
            1 for name, view in rows if name not in written or written[name].health != view.health
        )
        await self._store.write_health(rows, health_changes=changed)
        written.update(rows)


__all__ = ["Leadership", "SharedLeaseBook"]
