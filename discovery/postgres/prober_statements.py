"""The prober's statements (prober.py), each on the prober's second connection
of its own, never the pool a busy replica fills: the health of its share
written, the proxies only other replicas' fleets hold read, and the
crawlers' `error` reports on its share taken. Which proxies are its share
is sharing.py's."""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import psycopg
from psycopg.rows import class_row

from discovery.postgres import queries as q
from discovery.postgres.rows import ErrorRow, HealthView, ProbeRow
from discovery.postgres.store import PostgresStore

# A health flush that changes this many proxies' health (a new prober's first)
# refreshes the statistics: grants are planned on `health`.
ANALYZE_AFTER = 100

# Crawlers' `error` reports waiting (few, usually none), then those of this
# replica's proxies taken (counted, cleared) in the same transaction.
REPORTED = "SELECT name FROM discovery_proxies WHERE error_reports > 0"
TAKE_REPORTED = """WITH taken AS (
        SELECT name, error_reports, error_report FROM discovery_proxies
        WHERE name = ANY(%(names)s) AND error_reports > 0 FOR UPDATE)
    UPDATE discovery_proxies p SET error_reports = 0, error_report = NULL
    FROM taken WHERE p.name = taken.name
    RETURNING taken.name AS proxy, taken.error_reports AS count, taken.error_report AS error"""


async def write_health(
    conn: psycopg.AsyncConnection[Any],
    rows: Sequence[tuple[str, HealthView]],
    *,
    health_changes: int,
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
    async with conn.transaction():
        await conn.execute(q.WRITE_HEALTH, params)
        if health_changes >= ANALYZE_AFTER:
            await conn.execute("ANALYZE discovery_proxies")


async def foreign_proxies(
    store: PostgresStore, conn: psycopg.AsyncConnection[Any]
) -> list[ProbeRow]:
    """The proxies other replicas' fleets hold and `store`'s replica's lacks."""
    return await store.all(conn, ProbeRow, q.FOREIGN, store.params())


async def take_error_reports(
    conn: psycopg.AsyncConnection[Any], mine: Container[str]
) -> list[ErrorRow]:
    """The `error` reports of the proxies in `mine` (this replica probes
    them), counted per proxy and cleared; the others' stay for their prober."""
    async with conn.transaction():
        waiting = [row[0] for row in await (await conn.execute(REPORTED)).fetchall()]
        names = [name for name in waiting if name in mine]
        if not names:
            return []
        async with conn.cursor(row_factory=class_row(ErrorRow)) as cur:
            await cur.execute(TAKE_REPORTED, {"names": names})
            return await cur.fetchall()


def _array_literal(values: Sequence[float | None]) -> str:
    """A float8[] literal: `{1.5,NULL,2}`."""
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"


__all__ = ["ANALYZE_AFTER", "foreign_proxies", "take_error_reports", "write_health"]
