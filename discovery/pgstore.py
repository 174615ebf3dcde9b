"""The shared lease store: PostgreSQL, for several service replicas at once.

Unlike the SQLite store (one service, state in memory, the file a durable
log), the database here *is* the state: every grant, renewal, report and
release is one transaction, so any replica can serve any lease. Time is the
database's (`now()`), never a replica's clock.

Exclusivity: a grant locks the proxy's row it picks (`FOR UPDATE SKIP
LOCKED`: concurrent grants on other replicas skip it and take another) and
the lease table's `UNIQUE (proxy)` backs that up. Schema changes run under a
transaction-scoped advisory lock, so replicas starting together migrate once.

Every database failure becomes StoreError (the API answers 503 with
Retry-After); the pool reconnects by itself once the server is back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import tuple_row

from discovery.database import PostgresUrl
from discovery.fleet import FleetProxy
from discovery.leases import Candidate
from discovery.logs import event
from discovery.selection import Selector
from discovery.store import MAX_TARGET_COOLDOWNS, StoreError

log = logging.getLogger("discovery.pgstore")

SCHEMA_VERSION = 2
MIGRATION_LOCK = 0x6567_7265_7373  # "egress": the advisory lock key of schema changes
LEADER_LOCK = 0x6567_7265_7374  # held by the replica that runs the health probes
GRANT_ATTEMPTS = 8
# A health flush that changes this many proxies' health (a new prober's first)
# refreshes the statistics: grants are planned on `health`. (Rows rewritten
# only for their latency or recent probes do not count.)
ANALYZE_AFTER = 100
POOL_TIMEOUT_S = 2.0  # a request waits this long for a connection, then gets a 503
EVERYWHERE = "*"

# Index i holds the statements that bring the schema from version i to i + 1.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE discovery_proxies (
            name          text PRIMARY KEY,
            provider      text NOT NULL,
            zone          text,
            labels        jsonb NOT NULL DEFAULT '{}',
            health        text NOT NULL DEFAULT 'unknown',
            latency_ms    double precision,
            last_error    text,
            last_used     timestamptz,
            lease_expires timestamptz,               -- the live lease's end (NULL: free)
            error_report  text,                      -- a crawler's `error`, for the prober
            reported_at   timestamptz
        )""",
        # Grants walk proxies least recently used first and stop at the first
        # eligible one: without this index each grant sorts the whole fleet.
        """CREATE INDEX discovery_proxies_lru
            ON discovery_proxies (last_used ASC NULLS FIRST, name)""",
        # Every grant and release rewrites its proxy's row: room for updates in
        # place, and vacuum and statistics that keep up with a busy fleet.
        """ALTER TABLE discovery_proxies SET (fillfactor = 70,
            autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.05,
            autovacuum_vacuum_cost_delay = 0)""",
        """CREATE TABLE discovery_leases (
            id          text PRIMARY KEY,
            proxy       text NOT NULL UNIQUE REFERENCES discovery_proxies ON DELETE CASCADE,
            holder      text NOT NULL,
            target      text,
            ttl         double precision NOT NULL,
            granted_at  timestamptz NOT NULL,
            expires_at  timestamptz NOT NULL
        )""",
        "CREATE INDEX discovery_leases_expires ON discovery_leases (expires_at)",
        """ALTER TABLE discovery_leases SET (autovacuum_vacuum_scale_factor = 0.01,
            autovacuum_vacuum_cost_delay = 0)""",
        """CREATE TABLE discovery_cooldowns (
            proxy   text NOT NULL REFERENCES discovery_proxies ON DELETE CASCADE,
            target  text NOT NULL,                 -- a host name, or '*' for every target
            until   timestamptz NOT NULL,
            PRIMARY KEY (proxy, target)
        )""",
        """CREATE TABLE discovery_reports (
            seq       bigserial PRIMARY KEY,
            at        timestamptz NOT NULL,
            lease_id  text NOT NULL,
            proxy     text NOT NULL,
            holder    text NOT NULL,
            outcome   text NOT NULL CHECK (outcome IN ('ok', 'blocked', 'error')),
            target    text
        )""",
        "CREATE INDEX discovery_reports_at ON discovery_reports (at)",
    ),
    (
        # The latest probes' times (NULL for a failure), for the status page.
        "ALTER TABLE discovery_proxies ADD COLUMN recent_ms double precision[]",
    ),
)


@dataclass(frozen=True)
class LeaseRow:
    id: str
    proxy: str
    holder: str
    target: str | None
    ttl: float
    granted_at: float
    expires_at: float


@dataclass(frozen=True)
class ProxyRow:
    name: str
    health: str
    latency_ms: float | None
    last_error: str | None
    leased: bool
    cooldowns: tuple[tuple[str, float], ...]  # (target, until)
    lease: tuple[str, float] | None = None  # (holder, expires at) of the live lease
    recent_ms: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class HealthView:
    """What the prober writes of one proxy."""

    health: str
    latency_ms: float | None
    last_error: str | None
    recent_ms: tuple[float | None, ...]


def _scopes(host: str | None) -> list[str]:
    """The cooldown targets that keep a proxy from `host`."""
    return [EVERYWHERE, host] if host else [EVERYWHERE]


def _lease(row: Sequence[Any]) -> LeaseRow:
    return LeaseRow(row[0], row[1], row[2], row[3], float(row[4]), float(row[5]), float(row[6]))


_LEASE_COLUMNS = """id, proxy, holder, target, ttl,
    extract(epoch from granted_at)::float8, extract(epoch from expires_at)::float8"""


# The selector over discovery_proxies p: %(provider)s, %(zone)s, %(labels)s.
_SELECTED = """(%(provider)s::text IS NULL OR p.provider = %(provider)s)
      AND (%(zone)s::text IS NULL OR p.zone = %(zone)s)
      AND p.labels @> %(labels)s::jsonb"""

# One round trip: the least recently used eligible proxy, locked (rows another
# grant holds are skipped: it is taking them), marked used and leased. Whether
# a proxy is free is a column of its own row (lease_expires), not a lookup in
# the lease table: a row another grant just took comes back to this one's lock
# as its new version, and PostgreSQL checks the condition again on that, so a
# proxy leased meanwhile is passed over instead of picked. An expired lease of
# it may still be in the lease table: replaced in place; a live one is never
# touched (then no row comes back, see grant()).
_GRANT = f"""WITH picked AS (
        SELECT p.name FROM discovery_proxies p
        WHERE p.health = 'healthy' AND {_SELECTED}
          AND (p.lease_expires IS NULL OR p.lease_expires <= now())
          AND NOT EXISTS (SELECT 1 FROM discovery_cooldowns c
                          WHERE c.proxy = p.name AND c.target = ANY(%(scopes)s)
                            AND c.until > now())
        ORDER BY p.last_used ASC NULLS FIRST, p.name
        LIMIT 1 FOR UPDATE OF p SKIP LOCKED),
    used AS (
        UPDATE discovery_proxies p
        SET last_used = now(), lease_expires = now() + make_interval(secs => %(ttl)s)
        FROM picked WHERE p.name = picked.name RETURNING p.name)
    INSERT INTO discovery_leases (id, proxy, holder, target, ttl, granted_at, expires_at)
    SELECT %(id)s, used.name, %(holder)s, %(target)s, %(ttl)s, now(),
           now() + make_interval(secs => %(ttl)s)
    FROM used
    ON CONFLICT (proxy) DO UPDATE SET id = excluded.id, holder = excluded.holder,
        target = excluded.target, ttl = excluded.ttl, granted_at = excluded.granted_at,
        expires_at = excluded.expires_at
    WHERE discovery_leases.expires_at <= now()
    RETURNING {_LEASE_COLUMNS}"""

# An eligible proxy no other grant holds right now, locked for this one.
_ONE_FREE = f"""SELECT p.name FROM discovery_proxies p
    WHERE p.health = 'healthy' AND {_SELECTED}
      AND (p.lease_expires IS NULL OR p.lease_expires <= now())
      AND NOT EXISTS (SELECT 1 FROM discovery_cooldowns c
                      WHERE c.proxy = p.name AND c.target = ANY(%(scopes)s)
                        AND c.until > now())
    LIMIT 1 FOR UPDATE OF p SKIP LOCKED"""


# Renew and release, each one statement: the lease row and its proxy's
# lease_expires change together.
_RENEW = f"""WITH renewed AS (
        UPDATE discovery_leases
        SET ttl = LEAST(COALESCE(%s, ttl), %s),
            expires_at = now() + make_interval(secs => LEAST(COALESCE(%s, ttl), %s))
        WHERE id = %s AND expires_at > now()
        RETURNING *),
    marked AS (
        UPDATE discovery_proxies p SET lease_expires = renewed.expires_at
        FROM renewed WHERE p.name = renewed.proxy)
    SELECT {_LEASE_COLUMNS} FROM renewed"""

_RELEASE = """WITH ended AS (
        DELETE FROM discovery_leases WHERE id = %s AND expires_at > now() RETURNING proxy)
    UPDATE discovery_proxies p SET lease_expires = NULL
    FROM ended WHERE p.name = ended.proxy
    RETURNING p.name"""


def _selector_params(selector: Selector, host: str | None) -> dict[str, Any]:
    return {
        "provider": selector.provider,
        "zone": selector.zone,
        "labels": json.dumps(dict(selector.labels or {})),
        "scopes": _scopes(host),
    }


class PgStore:
    def __init__(self, database: PostgresUrl, *, max_size: int = 20) -> None:
        self.database = database
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
        starts (a plain connection: the pool lives on the server's loop);
        StoreError naming the database when it cannot."""
        try:
            with psycopg.connect(self.database.url, connect_timeout=10) as conn:
                version = _migrate(conn)
        except psycopg.Error as error:
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None
        except StoreError as error:
            raise StoreError(f"{self.database.shown}: {error}") from None
        if version != SCHEMA_VERSION:
            event(log, logging.INFO, "schema migrated", old=version, new=SCHEMA_VERSION)

    async def open(self) -> None:
        """Opens the connection pool (on the running loop)."""
        try:
            await self._pool.open(wait=True, timeout=10.0)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as error:
            await self._pool.close()
            raise StoreError(f"{self.database.shown}: cannot connect: {_reason(error)}") from None

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection in a transaction; any database failure is a StoreError."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as error:
            self.failure = _reason(error)
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None
        self.failure = None

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for one statement, its own transaction (one round trip
        instead of three); any database failure is a StoreError."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as error:
            self.failure = _reason(error)
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None
        self.failure = None

    # -- the fleet -------------------------------------------------------------------------

    async def sync_fleet(self, proxies: Iterable[FleetProxy], removed: Sequence[str]) -> int:
        """Adds or updates the fleet's proxies, drops `removed` with their leases
        and cooldowns; returns how many live leases that ended."""
        rows = [(p.name, p.provider, p.zone, json.dumps(dict(p.labels))) for p in proxies]
        async with self.transaction() as conn:
            revoked = 0
            if removed:
                cur = await conn.execute(
                    "DELETE FROM discovery_leases WHERE proxy = ANY(%s) AND expires_at > now()",
                    (list(removed),),
                )
                revoked = cur.rowcount
                await conn.execute(
                    "DELETE FROM discovery_proxies WHERE name = ANY(%s)", (list(removed),)
                )
            if rows:
                async with conn.cursor() as cur:
                    await cur.executemany(
                        """INSERT INTO discovery_proxies (name, provider, zone, labels)
                           VALUES (%s, %s, %s, %s::jsonb)
                           ON CONFLICT (name) DO UPDATE SET provider = excluded.provider,
                               zone = excluded.zone, labels = excluded.labels""",
                        rows,
                    )
            # Many rows changed (a new fleet): fresh statistics, or the grant's
            # plan may take the whole fleet for one row and sort it each time.
            await conn.execute("ANALYZE discovery_proxies")
            return revoked

    # -- leases ----------------------------------------------------------------------------

    async def grant(
        self, lease_id: str, holder: str, ttl: float, host: str | None, selector: Selector
    ) -> LeaseRow | None:
        """Leases the least recently used eligible proxy the selector matches;
        None when none is eligible right now."""
        params = _selector_params(selector, host) | {
            "id": lease_id,
            "holder": holder,
            "target": host,
            "ttl": ttl,
        }
        async with self.statement() as conn:  # the usual case: one round trip
            row = await (await conn.execute(_GRANT, params)).fetchone()
            if row is not None:
                return _lease(row)
        async with self.transaction() as conn:
            for _ in range(GRANT_ATTEMPTS):
                row = await (await conn.execute(_GRANT, params)).fetchone()
                if row is not None:
                    return _lease(row)
                # Nothing picked: every eligible proxy was being taken by other
                # grants (skipped), or there is none. One that is free and no
                # longer held by another grant is locked for this one now, and
                # the next pick (a new snapshot) takes it or a better one.
                if await (await conn.execute(_ONE_FREE, params)).fetchone() is None:
                    return None
        raise StoreError(f"no grant after {GRANT_ATTEMPTS} attempts under contention")

    async def renew(self, lease_id: str, ttl: float | None, max_ttl: float) -> LeaseRow | None:
        async with self.statement() as conn:
            cur = await conn.execute(_RENEW, (ttl, max_ttl, ttl, max_ttl, lease_id))
            row = await cur.fetchone()
            return _lease(row) if row else None

    async def live_lease(self, lease_id: str) -> LeaseRow | None:
        async with self.transaction() as conn:
            cur = await conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM discovery_leases "
                "WHERE id = %s AND expires_at > now()",
                (lease_id,),
            )
            row = await cur.fetchone()
            return _lease(row) if row else None

    async def report(
        self, lease_id: str, outcome: str, host: str | None, cooldown: float
    ) -> tuple[LeaseRow, str, float | None] | None:
        """Records a report on a live lease; `blocked` starts a cooldown (for
        `host`, else everywhere; capped as discovery.store.merge_cooldown says)
        and returns the target it ended up under and when it ends. None: no
        such lease."""
        async with self.transaction() as conn:
            # FOR UPDATE: reports on one lease (so on one proxy) take turns, so
            # each one's count of the proxy's cooldowns sees the one before.
            cur = await conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM discovery_leases "
                "WHERE id = %s AND expires_at > now() FOR UPDATE",
                (lease_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            lease = _lease(row)
            await conn.execute(
                """INSERT INTO discovery_reports (at, lease_id, proxy, holder, outcome, target)
                   VALUES (now(), %s, %s, %s, %s, %s)""",
                (lease.id, lease.proxy, lease.holder, outcome, host),
            )
            until = None
            scope = host or EVERYWHERE
            if outcome == "blocked" and cooldown > 0:
                cur = await conn.execute(
                    """INSERT INTO discovery_cooldowns (proxy, target, until)
                       VALUES (%s, %s, now() + make_interval(secs => %s))
                       ON CONFLICT (proxy, target)
                       DO UPDATE SET until = GREATEST(discovery_cooldowns.until, excluded.until)
                       RETURNING extract(epoch from until)::float8""",
                    (lease.proxy, scope, cooldown),
                )
                ended = await cur.fetchone()
                until = float(ended[0]) if ended else None
                if scope != EVERYWHERE:
                    widened = await self._cap_cooldowns(conn, lease.proxy)
                    if widened is not None:
                        scope, until = EVERYWHERE, widened
            elif outcome == "error":
                await conn.execute(
                    """UPDATE discovery_proxies SET error_report = %s, reported_at = now()
                       WHERE name = %s""",
                    (f"a crawler reported an error{' for ' + host if host else ''}", lease.proxy),
                )
            return lease, scope, until

    @staticmethod
    async def _cap_cooldowns(conn: psycopg.AsyncConnection[Any], proxy: str) -> float | None:
        """merge_cooldown's cap: more than MAX_TARGET_COOLDOWNS live target
        cooldowns on `proxy` become one cooldown everywhere, until the latest
        of them; returns when that ends (None: under the cap)."""
        cur = await conn.execute(
            """SELECT count(*) FROM discovery_cooldowns
               WHERE proxy = %s AND target <> %s AND until > now()""",
            (proxy, EVERYWHERE),
        )
        row = await cur.fetchone()
        if row is None or int(row[0]) <= MAX_TARGET_COOLDOWNS:
            return None
        cur = await conn.execute(
            """WITH gone AS (DELETE FROM discovery_cooldowns WHERE proxy = %s RETURNING until)
               INSERT INTO discovery_cooldowns (proxy, target, until)
               SELECT %s, %s, max(until) FROM gone
               RETURNING extract(epoch from until)::float8""",
            (proxy, proxy, EVERYWHERE),
        )
        widest = await cur.fetchone()
        return float(widest[0]) if widest else None

    async def release(self, lease_id: str) -> str | None:
        """Ends a live lease; its proxy's name, or None when there was none."""
        async with self.statement() as conn:
            row = await (await conn.execute(_RELEASE, (lease_id,))).fetchone()
            return str(row[0]) if row else None

    async def expire(self) -> int:
        """Removes leases past their time (grants already ignore them)."""
        async with self.transaction() as conn:
            cur = await conn.execute("DELETE FROM discovery_leases WHERE expires_at <= now()")
            await conn.execute(
                """UPDATE discovery_proxies SET lease_expires = NULL
                   WHERE lease_expires <= now()"""
            )
            return cur.rowcount

    async def prune(self, report_retention: float, reports_kept: int) -> None:
        """Drops cooldowns that ended, reports older than `report_retention`
        seconds and all but the newest `reports_kept` (fewer when the sequence
        has gaps: at most that many)."""
        async with self.transaction() as conn:
            await conn.execute("DELETE FROM discovery_cooldowns WHERE until <= now()")
            await conn.execute(
                "DELETE FROM discovery_reports WHERE at < now() - make_interval(secs => %s)",
                (report_retention,),
            )
            await conn.execute(
                """DELETE FROM discovery_reports
                   WHERE seq <= (SELECT max(seq) FROM discovery_reports) - %s""",
                (reports_kept,),
            )

    # -- views -----------------------------------------------------------------------------

    async def candidates(
        self, selector: Selector, host: str | None
    ) -> tuple[float, list[Candidate]]:
        """The database's time and the state of each proxy the selector
        matches, for a 409."""
        params = _selector_params(selector, host)
        async with self.transaction() as conn:
            cur = await conn.execute(
                f"""SELECT extract(epoch from now())::float8, p.name, p.health = 'healthy',
                        extract(epoch from l.expires_at)::float8,
                        (SELECT extract(epoch from max(c.until))::float8
                           FROM discovery_cooldowns c
                          WHERE c.proxy = p.name AND c.target = ANY(%(scopes)s)
                            AND c.until > now())
                    FROM discovery_proxies p
                    LEFT JOIN discovery_leases l
                      ON l.proxy = p.name AND l.expires_at > now()
                    WHERE {_SELECTED}""",
                params,
            )
            rows = await cur.fetchall()
        if not rows:
            async with self.transaction() as conn:
                now_row = await (
                    await conn.execute("SELECT extract(epoch from now())::float8")
                ).fetchone()
            return float(now_row[0]) if now_row else 0.0, []
        now = float(rows[0][0])
        return now, [Candidate(r[1], bool(r[2]), r[3], r[4]) for r in rows]

    async def proxies(self) -> tuple[float, dict[str, ProxyRow]]:
        """Every proxy with health, lease and live cooldowns (one transaction)."""
        async with self.transaction() as conn:
            cur = await conn.execute(
                """SELECT extract(epoch from now())::float8, p.name, p.health, p.latency_ms,
                          p.last_error, l.proxy IS NOT NULL, l.holder,
                          extract(epoch from l.expires_at)::float8, p.recent_ms
                   FROM discovery_proxies p
                   LEFT JOIN discovery_leases l ON l.proxy = p.name AND l.expires_at > now()"""
            )
            rows = await cur.fetchall()
            cur = await conn.execute(
                """SELECT proxy, target, extract(epoch from until)::float8
                   FROM discovery_cooldowns WHERE until > now() ORDER BY until, target"""
            )
            cooldowns = await cur.fetchall()
        now = float(rows[0][0]) if rows else 0.0
        by_proxy: dict[str, list[tuple[str, float]]] = {}
        for proxy, target, until in cooldowns:
            by_proxy.setdefault(proxy, []).append((target, float(until)))
        return now, {
            r[1]: ProxyRow(
                r[1],
                r[2],
                r[3],
                r[4],
                bool(r[5]),
                tuple(by_proxy.get(r[1], ())),
                (str(r[6]), float(r[7])) if r[5] else None,
                tuple(r[8] or ()),
            )
            for r in rows
        }

    async def counts(self) -> tuple[int, int]:
        """(live leases, live cooldowns)."""
        async with self.transaction() as conn:
            cur = await conn.execute(
                """SELECT (SELECT count(*) FROM discovery_leases WHERE expires_at > now()),
                          (SELECT count(*) FROM discovery_cooldowns WHERE until > now())"""
            )
            row = await cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    # -- health, written by the leader -----------------------------------------------------

    async def write_health(
        self, rows: Sequence[tuple[str, HealthView]], *, health_changes: int
    ) -> None:
        """(name, view) per proxy whose view changed; `health_changes`: how many
        of them changed health, which decides the ANALYZE."""
        if not rows:
            return
        async with self.transaction() as conn:
            # The histories travel as array literals (unnest would flatten a
            # two-dimensional array) and are cast back per row.
            await conn.execute(
                """UPDATE discovery_proxies p
                   SET health = h.health, latency_ms = h.latency, last_error = h.error,
                       recent_ms = h.recent::float8[]
                   FROM unnest(%s::text[], %s::text[], %s::float8[], %s::text[], %s::text[])
                        AS h(name, health, latency, error, recent)
                   WHERE p.name = h.name""",
                (
                    [name for name, _ in rows],
                    [v.health for _, v in rows],
                    [v.latency_ms for _, v in rows],
                    [v.last_error for _, v in rows],
                    [_array_literal(v.recent_ms) for _, v in rows],
                ),
            )
            if health_changes >= ANALYZE_AFTER:
                await conn.execute("ANALYZE discovery_proxies")

    async def take_error_reports(self) -> list[tuple[str, str]]:
        """Crawler `error` reports not yet handed to the prober (and clears them)."""
        async with self.transaction() as conn:
            cur = await conn.execute(
                """WITH taken AS (
                       SELECT name, error_report FROM discovery_proxies
                       WHERE error_report IS NOT NULL FOR UPDATE)
                   UPDATE discovery_proxies p SET error_report = NULL, reported_at = NULL
                   FROM taken WHERE p.name = taken.name
                   RETURNING taken.name, taken.error_report"""
            )
            return [(str(r[0]), str(r[1])) for r in await cur.fetchall()]

    # -- helpers ---------------------------------------------------------------------------

    async def connect_alone(self) -> psycopg.AsyncConnection[Any]:
        """A connection outside the pool (the leader's lock lives as long as it)."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.database.url, autocommit=True, connect_timeout=5
            )
        except psycopg.Error as error:
            raise StoreError(f"{self.database.shown}: {_reason(error)}") from None


def _migrate(conn: psycopg.Connection[Any]) -> int:
    """Applies the migrations this schema lacks, under a lock every replica
    takes first; returns the version found."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS discovery_schema (version integer NOT NULL)")
        row = conn.execute("SELECT version FROM discovery_schema").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"schema version {version} is newer than this service knows "
                f"({SCHEMA_VERSION}); run the newer service"
            )
        for statements in _MIGRATIONS[version:]:
            for statement in statements:
                conn.execute(statement)
        if row is None:
            conn.execute("INSERT INTO discovery_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            conn.execute("UPDATE discovery_schema SET version = %s", (SCHEMA_VERSION,))
    return version


def _array_literal(values: Sequence[float | None]) -> str:
    """A float8[] literal: `{1.5,NULL,2}`."""
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


__all__ = ["LEADER_LOCK", "HealthView", "LeaseRow", "PgStore", "ProxyRow"]
