"""The shared store's schema: its version in the table discovery_schema,
changed under a transaction-scoped advisory lock so that replicas starting
together migrate once."""

from __future__ import annotations

from typing import Any

import psycopg

from discovery.book.errors import StoreError

SCHEMA_VERSION = 5
MIGRATION_LOCK = 0x6567_7265_7373  # "egress": the advisory lock key of schema changes

# Index i holds the statements that bring the schema from version i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
    (
        # Which replicas' fleets hold each proxy (a digest per fleet, fleet.py):
        # a replica grants, renews, reports and releases only on proxies of its
        # own fleet, and a proxy no live fleet holds leaves the store.
        "ALTER TABLE discovery_proxies ADD COLUMN fleets text[] NOT NULL DEFAULT '{}'",
        """CREATE TABLE discovery_fleets (
            digest   text PRIMARY KEY,
            seen_at  timestamptz NOT NULL          -- when a replica last registered it
        )""",
        # Crawlers' `error` reports not yet handed to the prober, counted: each
        # is one failed probe (error_report keeps the last one's words).
        "ALTER TABLE discovery_proxies ADD COLUMN error_reports integer NOT NULL DEFAULT 0",
        "ALTER TABLE discovery_proxies DROP COLUMN reported_at",
    ),
    (
        # What probing a proxy needs (its fleet's manifest has it): the prober
        # also probes proxies only other replicas' fleets hold.
        """ALTER TABLE discovery_proxies ADD COLUMN host text, ADD COLUMN port integer,
            ADD COLUMN username text, ADD COLUMN password text""",
    ),
    (
        # Grants refused (409), one row per proxy group the selector matched:
        # the autopilot's unmet demand (discovery/book/signals.py).
        """CREATE TABLE discovery_refusals (
            seq     bigserial PRIMARY KEY,
            at      timestamptz NOT NULL,
            grp     text NOT NULL,
            holder  text NOT NULL
        )""",
        "CREATE INDEX discovery_refusals_at ON discovery_refusals (at)",
    ),
)


def migrate(conn: psycopg.Connection[Any]) -> int:
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
        for statements in MIGRATIONS[version:]:
            for statement in statements:
                conn.execute(statement)
        if row is None:
            conn.execute("INSERT INTO discovery_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            conn.execute("UPDATE discovery_schema SET version = %s", (SCHEMA_VERSION,))
    return version


__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_VERSION", "migrate"]
