"""The SQLite store's schema (its version is SQLite's `user_version`) and
how each operation (ops.py) is written in SQL."""

from __future__ import annotations

import sqlite3

from discovery.book.rules import merge_cooldown
from discovery.sqlite.ops import (
    AddRefusals,
    AddReport,
    EndLease,
    ForgetProxy,
    Op,
    Prune,
    PutCooldown,
    PutLease,
    Touch,
)

SCHEMA_VERSION = 2

# Index i holds the statements that bring a store from version i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE leases (
            id          TEXT PRIMARY KEY,
            proxy       TEXT NOT NULL UNIQUE,      -- a proxy has at most one lease
            holder      TEXT NOT NULL,
            target      TEXT,
            ttl         REAL NOT NULL,
            granted_at  REAL NOT NULL,
            expires_at  REAL NOT NULL
        ) STRICT""",
        """CREATE TABLE cooldowns (
            proxy   TEXT NOT NULL,
            target  TEXT NOT NULL,                 -- a host name, or '*' for every target
            until   REAL NOT NULL,
            PRIMARY KEY (proxy, target)
        ) STRICT, WITHOUT ROWID""",
        """CREATE TABLE reports (
            seq       INTEGER PRIMARY KEY,
            at        REAL NOT NULL,
            lease_id  TEXT NOT NULL,
            proxy     TEXT NOT NULL,
            holder    TEXT NOT NULL,
            outcome   TEXT NOT NULL CHECK (outcome IN ('ok', 'blocked', 'error')),
            target    TEXT
        ) STRICT""",
        "CREATE INDEX reports_at ON reports (at)",
        # When each proxy was last leased, so least-recently-used order survives a
        # restart. Kept by a trigger: one statement per grant instead of two.
        """CREATE TABLE usage (
            proxy      TEXT PRIMARY KEY,
            last_used  REAL NOT NULL
        ) STRICT, WITHOUT ROWID""",
        """CREATE TRIGGER leases_mark_used AFTER INSERT ON leases BEGIN
            INSERT INTO usage (proxy, last_used) VALUES (new.proxy, new.granted_at)
            ON CONFLICT (proxy) DO UPDATE SET last_used = excluded.last_used;
        END""",
    ),
    (
        # Grants refused (409), one row per proxy group the selector matched:
        # the autopilot's unmet demand (discovery/book/signals.py).
        """CREATE TABLE refusals (
            seq     INTEGER PRIMARY KEY,
            at      REAL NOT NULL,
            grp     TEXT NOT NULL,
            holder  TEXT NOT NULL
        ) STRICT""",
        "CREATE INDEX refusals_at ON refusals (at)",
    ),
)


def execute(db: sqlite3.Connection, op: Op) -> None:
    match op:
        case PutLease(lease=r):
            db.execute(
                "INSERT INTO leases (id, proxy, holder, target, ttl, granted_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET ttl = excluded.ttl, expires_at = excluded.expires_at",
                (r.id, r.proxy, r.holder, r.target, r.ttl, r.granted_at, r.expires_at),
            )
        case EndLease(lease_id=lease_id):
            db.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
        case PutCooldown(cooldown=c, now=now):
            # The rule is rules.merge_cooldown, applied to what the store holds.
            scopes = dict(
                db.execute("SELECT target, until FROM cooldowns WHERE proxy = ?", (c.proxy,))
            )
            scope = merge_cooldown(scopes, c.target, c.until, now)
            if scope != c.target:  # widened: one cooldown everywhere instead
                db.execute("DELETE FROM cooldowns WHERE proxy = ?", (c.proxy,))
            db.execute(
                "INSERT INTO cooldowns (proxy, target, until) VALUES (?, ?, ?)"
                " ON CONFLICT (proxy, target) DO UPDATE SET until = excluded.until",
                (c.proxy, scope, scopes[scope]),
            )
        case ForgetProxy(proxy=proxy):
            db.execute("DELETE FROM cooldowns WHERE proxy = ?", (proxy,))
            db.execute("DELETE FROM usage WHERE proxy = ?", (proxy,))
        case AddReport(report=r):
            db.execute(
                "INSERT INTO reports (at, lease_id, proxy, holder, outcome, target)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (r.at, r.lease_id, r.proxy, r.holder, r.outcome, r.target),
            )
        case AddRefusals(at=at, groups=groups, holder=holder):
            db.executemany(
                "INSERT INTO refusals (at, grp, holder) VALUES (?, ?, ?)",
                [(at, group, holder) for group in groups],
            )
        case Prune(
            now=now,
            reports_before=before,
            reports_kept=kept,
            refusals_before=refused_before,
            refusals_kept=refused_kept,
        ):
            db.execute("DELETE FROM cooldowns WHERE until <= ?", (now,))
            _prune(db, "reports", before, kept)
            if refused_before is not None:
                _prune(db, "refusals", refused_before, refused_kept)
        case Touch():
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _prune(db: sqlite3.Connection, table: str, before: float, kept: int) -> None:
    """Rows of `table` older than `before` go, and all but the newest `kept`."""
    db.execute(f"DELETE FROM {table} WHERE at < ?", (before,))
    # seq is the rowid: new rows take max + 1, so the newest `kept` rows are
    # those above max - kept.
    db.execute(f"DELETE FROM {table} WHERE seq <= (SELECT max(seq) FROM {table}) - ?", (kept,))


# What GET /v1/signals counts (discovery/book/signals.py), over rows after `since`.
BANS = """SELECT proxy, count(DISTINCT target), count(*), max(at) FROM reports
    WHERE outcome = 'blocked' AND at > ? GROUP BY proxy"""
REFUSALS = """SELECT grp, count(*), count(DISTINCT holder), min(at), max(at) FROM refusals
    WHERE at > ? GROUP BY grp"""


__all__ = ["BANS", "MIGRATIONS", "REFUSALS", "SCHEMA_VERSION", "execute"]
