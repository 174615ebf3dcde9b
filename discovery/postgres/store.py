"""The shared lease store: PostgreSQL, for several service replicas at once.

Unlike the SQLite store (one service, state in memory, the file a durable
log), the database here *is* the state: every grant, renewal, report and
release is one transaction, so any replica can serve any lease. Time is the
database's (`now()`), never a replica's clock, unless a clock is given
(tests drive both stores with one fake clock).

Exclusivity: a grant locks the proxy's row it picks (`FOR UPDATE SKIP
LOCKED`: concurrent grants on other replicas skip it and take another) and
the lease table's `UNIQUE (proxy)` backs that up.

Every database failure becomes StoreError, whose text (the database's URL
without its password, and the reason) is for the log only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.rows import class_row, tuple_row

from discovery.book.contract import LeaseRecord
from discovery.book.errors import StoreError
from discovery.book.rules import EVERYWHERE, cooldown_scopes, merge_cooldown
from discovery.database import PostgresUrl
from discovery.logs import event
from discovery.postgres import queries as q
from discovery.postgres.rows import (
    CandidateRow,
    CooldownRow,
    ErrorRow,
    GrantRow,
    HealthCount,
    HealthView,
    Now,
    ProxyRow,
    Scopes,
)
from discovery.postgres.schema import SCHEMA_VERSION, migrate
from discovery.selection import Selector

log = logging.getLogger("discovery.pgstore")

R = TypeVar("R")
GRANT_ATTEMPTS = 8
# A health flush that changes this many proxies' health (a new prober's first)
# refreshes the statistics: grants are planned on `health`.
ANALYZE_AFTER = 100
POOL_TIMEOUT_S = 2.0  # a request waits this long for a connection, then gets a 503


class PostgresStore:
    def __init__(
        self,
        database: PostgresUrl,
        *,
        max_size: int = 20,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.database = database
        self._clock = clock
        self.fleet = ""  # this replica's fleet digest (fleets.py), set before any lease work
        self._pool = psycopg_pool.AsyncConnectionPool(
            database.url,
            min_size=1,
            max_size=max_size,
            timeout=POOL_TIMEOUT_S,
            open=False,
            kwargs={"autocommit": True, "row_factory": tuple_row},
            name="discovery",
        )
        # Why the database was last unreachable; None once a transaction
        # succeeds again (readiness).
        self.failure: str | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def migrate(self) -> None:
        """Connects once and brings the schema up to date, before the server
        starts (a plain connection: the pool lives on the server's loop)."""
        try:
            with psycopg.connect(self.database.url, connect_timeout=10) as conn:
                version = migrate(conn)
        except psycopg.Error as error:
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None
        except StoreError as error:
            raise StoreError(f"{self.database.shown}: {error}") from None
        if version != SCHEMA_VERSION:
            event(log, logging.INFO, "schema migrated", old=version, new=SCHEMA_VERSION)

    async def open(self) -> None:
        try:
            await self._pool.open(wait=True, timeout=10.0)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as error:
            await self._pool.close()
            raise StoreError(f"{self.database.shown}: cannot connect: {_reason(error)}") from None

    async def close(self) -> None:
        await self._pool.close()

    async def connect_alone(self) -> psycopg.AsyncConnection[Any]:
        """A connection outside the pool (the leader's lock lives as long as it)."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.database.url, autocommit=True, connect_timeout=5
            )
        except psycopg.Error as error:
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None

    # -- running SQL -----------------------------------------------------------------------

    def params(self, **values: Any) -> dict[str, Any]:
        """`values` with the store's time and this replica's fleet."""
        now = self._clock() if self._clock is not None else None
        moment = datetime.fromtimestamp(now, UTC) if now is not None else None
        return {"now": moment, "fleet": self.fleet, **values}

    @asynccontextmanager
    async def connection(self, *, transaction: bool) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection (in a transaction, or for one statement that is
        its own: one round trip instead of three); any database failure is a
        StoreError."""
        try:
            async with self._pool.connection() as conn:
                if transaction:
                    async with conn.transaction():
                        yield conn
                else:
                    yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as error:
            self.failure = _reason(error)
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None
        self.failure = None

    async def one(
        self, conn: psycopg.AsyncConnection[Any], row: type[R], sql: str, params: dict[str, Any]
    ) -> R | None:
        async with conn.cursor(row_factory=class_row(row)) as cur:
            await cur.execute(sql, params)
            return await cur.fetchone()

    async def all(
        self, conn: psycopg.AsyncConnection[Any], row: type[R], sql: str, params: dict[str, Any]
    ) -> list[R]:
        async with conn.cursor(row_factory=class_row(row)) as cur:
            await cur.execute(sql, params)
            return await cur.fetchall()

    # -- leases ----------------------------------------------------------------------------

    async def grant(
        self, lease_id: str, holder: str, ttl: float, host: str | None, selector: Selector
    ) -> GrantRow | None:
        """Leases the least recently used eligible proxy the selector matches;
        None when none is eligible right now."""
        params = self.params(id=lease_id, holder=holder, target=host, ttl=ttl)
        params |= _selector_params(selector, host)
        async with self.connection(transaction=False) as conn:  # the usual case: one round trip
            row = await self.one(conn, GrantRow, q.GRANT, params)
            if row is not None:
                return row
        async with self.connection(transaction=True) as conn:
            for _ in range(GRANT_ATTEMPTS):
                row = await self.one(conn, GrantRow, q.GRANT, params)
                if row is not None:
                    return row
                # Nothing picked: every eligible proxy was being taken by other
                # grants (skipped), or there is none. One that is free and no
                # longer held by another grant is locked for this one now, and
                # the next pick (a new snapshot) takes it or a better one.
                if await (await conn.execute(q.ONE_FREE, params)).fetchone() is None:
                    return None
        raise StoreError(f"no grant after {GRANT_ATTEMPTS} attempts under contention")

    async def renew(self, lease_id: str, ttl: float | None, max_ttl: float) -> LeaseRecord | None:
        async with self.connection(transaction=False) as conn:
            return await self.one(
                conn, LeaseRecord, q.RENEW, self.params(id=lease_id, ttl=ttl, max_ttl=max_ttl)
            )

    async def report(
        self, lease_id: str, outcome: str, host: str | None, cooldown: float
    ) -> tuple[LeaseRecord, str, float | None] | None:
        """Records a report on a live lease of this fleet: `blocked` starts a
        cooldown (for `host`, else everywhere; capped as rules.merge_cooldown
        says) and returns the target it ended up under and when it ends; each
        `error` is counted for the prober. None: no such lease."""
        async with self.connection(transaction=True) as conn:
            lease = await self.one(conn, LeaseRecord, q.REPORTED_LEASE, self.params(id=lease_id))
            if lease is None:
                return None
            on = self.params(id=lease.id, proxy=lease.proxy, holder=lease.holder, target=host)
            await conn.execute(q.ADD_REPORT, on | {"outcome": outcome})
            until = None
            scope = host or EVERYWHERE
            if outcome == "blocked" and cooldown > 0:
                scope, until = await self._cool_down(conn, on, scope, cooldown)
            elif outcome == "error":
                where = f" for {host}" if host else ""
                await conn.execute(
                    q.ADD_ERROR, on | {"error": f"a crawler reported an error{where}"}
                )
            return lease, scope, until

    async def cooling(self, lease_id: str, scopes: list[str]) -> bool | None:
        """Whether a live lease's proxy cools down for any of `scopes`; None: no such lease."""
        async with self.connection(transaction=False) as conn:
            cur = await conn.execute(q.LEASE_COOLING, self.params(id=lease_id, scopes=scopes))
            row = await cur.fetchone()
            return bool(row[0]) if row else None

    async def _cool_down(
        self, conn: psycopg.AsyncConnection[Any], on: dict[str, Any], target: str, cooldown: float
    ) -> tuple[str, float]:
        """rules.merge_cooldown on the proxy's stored cooldowns: the target the
        cooldown ended up under, and when it ends."""
        held = await self.one(conn, Scopes, q.COOLDOWNS_OF, on)
        assert held is not None  # one row, always
        scopes = dict(held.scopes)
        scope = merge_cooldown(scopes, target, held.now + cooldown, held.now)
        if scope != target:  # widened: one cooldown everywhere instead
            await conn.execute(q.DROP_COOLDOWNS, on)
        await conn.execute(q.PUT_COOLDOWN, on | {"scope": scope, "until": scopes[scope]})
        return scope, scopes[scope]

    async def release(self, lease_id: str) -> str | None:
        """Ends a live lease of this fleet; its proxy's name, or None when there was none."""
        async with self.connection(transaction=False) as conn:
            row = await (await conn.execute(q.RELEASE, self.params(id=lease_id))).fetchone()
            return str(row[0]) if row else None

    async def expire(self) -> int:
        """Removes leases past their time (grants already ignore them)."""
        params = self.params()
        async with self.connection(transaction=True) as conn:
            cur = await conn.execute(q.EXPIRE, params)
            await conn.execute(q.UNMARK_EXPIRED, params)
            return cur.rowcount

    async def prune(self, report_retention: float, reports_kept: int) -> None:
        """Drops cooldowns that ended, reports older than `report_retention`
        seconds and all but the newest `reports_kept` (fewer when the sequence
        has gaps: at most that many)."""
        params = self.params(retention=report_retention, kept=reports_kept)
        async with self.connection(transaction=True) as conn:
            for statement in q.PRUNE:
                await conn.execute(statement, params)

    # -- views -----------------------------------------------------------------------------

    async def candidates(
        self, selector: Selector, host: str | None
    ) -> tuple[float, list[CandidateRow]]:
        """The store's time and the state of each proxy of this fleet the
        selector matches, for a 409."""
        params = self.params() | _selector_params(selector, host)
        async with self.connection(transaction=True) as conn:
            now = await self.one(conn, Now, q.CLOCK, params)
            rows = await self.all(conn, CandidateRow, q.CANDIDATES, params)
        return (now.now if now else 0.0), rows

    async def proxies(self) -> tuple[float, dict[str, ProxyRow], list[CooldownRow]]:
        """The store's time, this fleet's proxies and their live cooldowns
        (one transaction)."""
        params = self.params()
        async with self.connection(transaction=True) as conn:
            now = await self.one(conn, Now, q.CLOCK, params)
            rows = await self.all(conn, ProxyRow, q.PROXIES, params)
            cooldowns = await self.all(conn, CooldownRow, q.COOLDOWNS, params)
        return (now.now if now else 0.0), {r.name: r for r in rows}, cooldowns

    async def gauges(self) -> list[HealthCount]:
        """This fleet's proxies counted by health, with leases and live cooldowns."""
        async with self.connection(transaction=False) as conn:
            return await self.all(conn, HealthCount, q.GAUGES, self.params())

    # -- health, written by the leader -----------------------------------------------------

    async def write_health(
        self, rows: Sequence[tuple[str, HealthView]], *, health_changes: int
    ) -> None:
        """(name, view) per proxy whose view changed; `health_changes`: how many
        of them changed health, which decides the ANALYZE."""
        if not rows:
            return
        params = {
            "names": [name for name, _ in rows],
            "healths": [v.health for _, v in rows],
            "latencies": [v.latency_ms for _, v in rows],
            "errors": [v.last_error for _, v in rows],
            "recents": [_array_literal(v.recent_ms) for _, v in rows],
        }
        async with self.connection(transaction=True) as conn:
            await conn.execute(q.WRITE_HEALTH, params)
            if health_changes >= ANALYZE_AFTER:
                await conn.execute("ANALYZE discovery_proxies")

    async def take_error_reports(self) -> list[ErrorRow]:
        """Crawler `error` reports not yet handed to the prober, counted per
        proxy (and cleared)."""
        async with self.connection(transaction=True) as conn:
            return await self.all(conn, ErrorRow, q.TAKE_ERRORS, {})


def _selector_params(selector: Selector, host: str | None) -> dict[str, Any]:
    return {
        "provider": selector.provider,
        "zone": selector.zone,
        "labels": json.dumps(dict(selector.labels or {})),
        "scopes": cooldown_scopes(host),
    }


def _array_literal(values: Sequence[float | None]) -> str:
    """A float8[] literal: `{1.5,NULL,2}`."""
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


__all__ = ["PostgresStore"]
