"""The shared lease store: PostgreSQL, for several service replicas at once.

Unlike the SQLite store (one service, state in memory, the file a durable
log), the database here *is* the state: every grant, renewal, report and
release is one transaction, so any replica can serve any lease. Time is the
database's (`now()`), never a replica's clock, unless a clock is given
(tests drive both stores with one fake clock).

The store reads and writes; the book (book.py) decides, with the rules of
discovery/book/rules.py. Where a decision needs what the database holds
(a report's cooldown merged into the proxy's, a renewal of the lease's own
TTL, a grant retried under contention), the book opens a transaction here
and runs the store's statements on it (`Db`) around its decision.

Exclusivity: a grant locks the proxy's row it picks (`FOR UPDATE SKIP
LOCKED`: concurrent grants on other replicas skip it and take another) and
the lease table's `UNIQUE (proxy)` backs that up.

Every database failure becomes StoreError, whose text (the database's URL
without its password, and the reason) is for the log only. Waiting too long
for a pooled connection is StoreBusy instead, while the database answers
(`failure` is None): load, not an outage. Whether it answers is judged by
the replica's own connection (prober.py), never by the pool, which a
busy replica fills.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.rows import class_row, tuple_row

from discovery.book.contract import LeaseRecord
from discovery.book.errors import StoreError
from discovery.book.rules import Eligibility
from discovery.book.signals import BanCount, RefusalCount, SignalCounts
from discovery.database import PostgresUrl
from discovery.logs import event
from discovery.postgres import queries as q
from discovery.postgres.conflicts import StoreConflict, retrying
from discovery.postgres.rows import (
    CandidateRow,
    CooldownRow,
    GrantRow,
    HealthCount,
    LiveLease,
    Now,
    ProxyRow,
    Scopes,
)
from discovery.postgres.schema import SCHEMA_VERSION, migrate

log = logging.getLogger("discovery.pgstore")

R = TypeVar("R")
POOL_TIMEOUT_S = 2.0  # a request waits this long for a connection, then gets a 503
BUSY_LOG_S = 10.0  # at most one log line this often for requests refused as busy


class StoreBusy(StoreError):
    """No pooled connection was free in time while the database answers."""


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
        # Why the database cannot be reached, as the replica's own connection
        # last found (prober.py); None while it answers (readiness).
        self.failure: str | None = None
        self._busy = 0  # requests refused as busy since the last log line
        self._busy_logged = 0.0

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
        """A connection outside the pool (a probing slot lives as long as it)."""
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
        StoreError, and no connection free within POOL_TIMEOUT_S while the
        database answers is a StoreBusy."""
        try:
            async with self._pool.connection() as conn:
                if transaction:
                    async with conn.transaction():
                        yield conn
                else:
                    yield conn
        except (psycopg_pool.PoolTimeout, psycopg_pool.TooManyRequests) as error:
            if self.failure is None:
                self._note_busy()
                raise StoreBusy(f"no database connection free in {POOL_TIMEOUT_S:g} s") from None
            raise StoreError(f"{self.database.shown}: {self.failure} ({_reason(error)})") from None
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as error:
            # Aborted to break a cycle, nothing changed: callers may run it again (conflicts.py).
            raise StoreConflict(f"{self.database.shown}: {_reason(error)}") from None
        except psycopg.OperationalError as error:
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None

    def _note_busy(self) -> None:
        """One log line for many refusals: under load there may be hundreds a second."""
        self._busy += 1
        now = time.monotonic()
        if now - self._busy_logged >= BUSY_LOG_S:
            event(
                log,
                logging.WARNING,
                "requests refused as overloaded: no database connection free in time",
                refused=self._busy,
                pool_size=self._pool.max_size,
                wait_s=POOL_TIMEOUT_S,
            )
            self._busy, self._busy_logged = 0, now

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

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Db]:
        """The store's statements on one connection, in one transaction."""
        async with self.connection(transaction=True) as conn:
            yield Db(self, conn)

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[Db]:
        """The store's statements on one connection, each its own transaction."""
        async with self.connection(transaction=False) as conn:
            yield Db(self, conn)

    # -- leases ----------------------------------------------------------------------------

    async def lease_cooldowns(self, lease_id: str) -> Scopes | None:
        """The cooldowns of a live lease's proxy (ended ones included) and the
        store's time; None: no such lease."""
        async with self.connection(transaction=False) as conn:
            return await self.one(conn, Scopes, q.LEASE_COOLDOWNS, self.params(id=lease_id))

    async def release(self, lease_ids: Sequence[str]) -> list[str | None]:
        """Ends the live leases of this fleet among LEASE_IDS, in one
        statement; per id, in order, its proxy's name, or None when there was
        no such lease (an id given twice ends its lease once: the first)."""

        async def once() -> dict[str, str]:
            async with self.connection(transaction=False) as conn:
                cur = await conn.execute(q.RELEASE, self.params(ids=list(lease_ids)))
                return {str(lease): str(proxy) for lease, proxy in await cur.fetchall()}

        ended = await retrying(once)
        return [ended.pop(lease, None) for lease in lease_ids]

    async def end_foreign(self, lease_id: str) -> str | None:
        """Ends a live lease on a proxy this replica's fleet lacks; its proxy's
        name, or None when there was none."""
        async with self.connection(transaction=False) as conn:
            row = await (await conn.execute(q.END_FOREIGN, self.params(id=lease_id))).fetchone()
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

    async def add_refusals(self, groups: Sequence[str], holder: str) -> None:
        """A grant refused now, for each of `groups` (discovery/book/signals.py)."""
        async with self.connection(transaction=False) as conn:
            await conn.execute(q.ADD_REFUSALS, self.params(groups=list(groups), holder=holder))

    async def prune_refusals(self, retention: float, kept: int) -> None:
        params = self.params(retention=retention, kept=kept)
        async with self.connection(transaction=True) as conn:
            for statement in q.PRUNE_REFUSALS:
                await conn.execute(statement, params)

    # -- views -----------------------------------------------------------------------------

    async def count_signals(self, window: float) -> SignalCounts:
        """The store's time, the `blocked` reports per proxy and the refusals
        per group of the last `window` seconds (one transaction; every proxy
        and group the store knows: the book keeps its fleet's)."""
        params = self.params(window=window)
        async with self.connection(transaction=True) as conn:
            now = await self.one(conn, Now, q.CLOCK, params)
            bans = await self.all(conn, BanCount, q.BANS, params)
            refusals = await self.all(conn, RefusalCount, q.REFUSALS, params)
        return SignalCounts(now.now if now else 0.0, window, bans, refusals)

    async def candidates(self, wanted: Eligibility) -> tuple[float, list[CandidateRow]]:
        """The store's time and the state of each proxy of this fleet the
        selector matches, with its cooldowns under the scopes, for a 409."""
        params = self.params() | _eligibility_params(wanted)
        async with self.connection(transaction=False) as conn:
            rows = await self.all(conn, CandidateRow, q.CANDIDATES, params)
        return (rows[0].now if rows else 0.0), rows

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


@dataclass(frozen=True)
class Pick:
    """A grant as the GRANT statement takes it: the lease to make, and which
    proxies it may take (decided by the book)."""

    lease_id: str
    holder: str
    target: str | None
    ttl: float
    wanted: Eligibility


class Db:
    """The store's statements on one connection (PostgresStore.transaction
    or .statements), for the book to run around its decisions."""

    def __init__(self, store: PostgresStore, conn: psycopg.AsyncConnection[Any]) -> None:
        self._store = store
        self._conn = conn

    async def grant(self, picks: Sequence[Pick]) -> list[GrantRow | None]:
        """Leases the least recently used eligible proxies to PICKS (which ask
        the same of a proxy: one `eligibility_key`), in one statement; per
        pick, in order, its lease, or None when no eligible proxy was left
        for it or every one left is being taken by another grant (skipped,
        not waited for)."""
        first = picks[0]
        params = self._store.params(
            ids=[p.lease_id for p in picks],
            holders=[p.holder for p in picks],
            targets=[p.target for p in picks],
            ttls=[p.ttl for p in picks],
        )
        rows = await self._store.all(
            self._conn, GrantRow, q.GRANT, params | _eligibility_params(first.wanted)
        )
        granted = {row.id: row for row in rows}
        return [granted.get(p.lease_id) for p in picks]

    async def lock_one_free(self, pick: Pick) -> bool:
        """Locks one eligible proxy no other grant holds, for this
        transaction; False when there is none."""
        cur = await self._conn.execute(q.ONE_FREE, _pick_params(self._store, pick))
        return await cur.fetchone() is not None

    async def live_lease(self, lease_id: str) -> LiveLease | None:
        """A live lease of this fleet, locked until the transaction ends (so
        changes to one lease, and reports on its proxy, take turns), with the
        store's time."""
        params = self._store.params(id=lease_id)
        return await self._store.one(self._conn, LiveLease, q.LIVE_LEASE, params)

    async def renew(self, lease_id: str, ttl: float) -> LeaseRecord | None:
        """Sets a live lease's TTL to `ttl` and its end to now + `ttl`."""
        params = self._store.params(id=lease_id, ttl=ttl)
        return await self._store.one(self._conn, LeaseRecord, q.RENEW, params)

    async def add_report(self, lease: LeaseRecord, outcome: str, target: str | None) -> None:
        params = self._store.params(
            id=lease.id, proxy=lease.proxy, holder=lease.holder, outcome=outcome, target=target
        )
        await self._conn.execute(q.ADD_REPORT, params)

    async def cooldowns_of(self, proxy: str) -> dict[str, float]:
        """A proxy's cooldowns (target -> until), ended ones included."""
        held = await self._store.one(
            self._conn, Scopes, q.COOLDOWNS_OF, self._store.params(proxy=proxy)
        )
        assert held is not None  # one row, always
        return dict(held.scopes)

    async def drop_cooldowns(self, proxy: str) -> None:
        await self._conn.execute(q.DROP_COOLDOWNS, {"proxy": proxy})

    async def put_cooldown(self, proxy: str, target: str, until: float) -> None:
        await self._conn.execute(q.PUT_COOLDOWN, {"proxy": proxy, "target": target, "until": until})

    async def add_error(self, proxy: str, error: str) -> None:
        """Counts one failed probe for the prober (each one:
        prober_statements.take_error_reports)."""
        await self._conn.execute(q.ADD_ERROR, {"proxy": proxy, "error": error})


def _eligibility_params(wanted: Eligibility) -> dict[str, Any]:
    selector = wanted.selector
    return {
        "provider": selector.provider,
        "zone": selector.zone,
        "labels": json.dumps(dict(selector.labels or {})),
        "scopes": list(wanted.scopes),
    }


def eligibility_key(wanted: Eligibility) -> str:
    """Grants with one key ask the same of a proxy: one GRANT serves them."""
    return json.dumps(_eligibility_params(wanted), sort_keys=True)


def _pick_params(store: PostgresStore, pick: Pick) -> dict[str, Any]:
    params = store.params(id=pick.lease_id, holder=pick.holder, target=pick.target, ttl=pick.ttl)
    return params | _eligibility_params(pick.wanted)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


__all__ = ["Db", "Pick", "PostgresStore", "StoreBusy", "eligibility_key"]
