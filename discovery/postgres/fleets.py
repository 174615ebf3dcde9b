"""Which proxies the shared store holds, when replicas may serve different
fleets (one reloaded before another; a fleet swapped across a restart).

Each replica names its fleet by a digest of its proxies' names and tags
every proxy of it with that digest (the `fleets` column); it grants, renews,
reports and releases only on proxies carrying its own tag, so a proxy its
fleet lacks is never handed out or touched by it (a 404 or a 409, never a
lease it cannot describe; that 404 ends the lease, book.py). Each proxy's
row also holds how to reach it, so that the prober, whatever its own fleet,
probes it (prober.py). Replicas register their fleet at start and every
maintenance round; a fleet no replica has registered for FLEET_TTL_S is
dropped, and a proxy no remaining fleet holds leaves the store with its
lease (revoked), cooldowns and usage: what a fleet change does at once on
the replica that saw it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from discovery.fleet import FleetProxy
from discovery.postgres import queries as q
from discovery.postgres.store import PostgresStore

# Ten maintenance rounds (30 s each): a database down for minutes must not
# make the first replica back drop the fleets of the others.
FLEET_TTL_S = 300.0

_REGISTER = f"""INSERT INTO discovery_fleets (digest, seen_at) VALUES (%(fleet)s, {q.NOW})
    ON CONFLICT (digest) DO UPDATE SET seen_at = excluded.seen_at"""
_UPSERT = """INSERT INTO discovery_proxies
        (name, provider, zone, labels, fleets, host, port, username, password)
    VALUES (%(name)s, %(provider)s, %(zone)s, %(labels)s::jsonb, ARRAY[%(fleet)s],
        %(host)s, %(port)s, %(username)s, %(password)s)
    ON CONFLICT (name) DO UPDATE SET provider = excluded.provider, zone = excluded.zone,
        labels = excluded.labels, host = excluded.host, port = excluded.port,
        username = excluded.username, password = excluded.password,
        fleets = CASE WHEN %(fleet)s = ANY(discovery_proxies.fleets)
                      THEN discovery_proxies.fleets
                      ELSE array_append(discovery_proxies.fleets, %(fleet)s) END"""
# The proxies of a fleet the table lacks, lacks the fleet's tag on, or holds
# with other attributes (another replica's older fleet wrote them): the
# fleet's rows as arrays, one per column (named by it), one element per proxy.
_DIFFERENT = """SELECT n.name FROM unnest(%(name)s::text[], %(provider)s::text[], %(zone)s::text[],
        %(labels)s::jsonb[], %(host)s::text[], %(port)s::int[], %(username)s::text[],
        %(password)s::text[]) AS n(name, provider, zone, labels, host, port, username, password)
    WHERE NOT EXISTS (SELECT 1 FROM discovery_proxies p
        WHERE p.name = n.name AND %(fleet)s = ANY(p.fleets)
          AND (p.provider, p.zone, p.labels, p.host, p.port, p.username, p.password)
              IS NOT DISTINCT FROM
              (n.provider, n.zone, n.labels, n.host, n.port, n.username, n.password))"""
_REVOKE = f"""DELETE FROM discovery_leases WHERE proxy = ANY(%(names)s) AND expires_at > {q.NOW}"""
_REMOVE = "DELETE FROM discovery_proxies WHERE name = ANY(%(names)s)"
_DEAD = f"""DELETE FROM discovery_fleets
    WHERE seen_at < {q.NOW} - make_interval(secs => %(ttl)s) AND digest <> %(fleet)s
    RETURNING digest"""
_UNTAG = """UPDATE discovery_proxies
    SET fleets = ARRAY(SELECT f FROM unnest(fleets) f WHERE f <> ALL(%(dead)s))
    WHERE fleets && %(dead)s::text[]"""
_ORPHANS = "SELECT name FROM discovery_proxies WHERE cardinality(fleets) = 0"


def digest(names: Iterable[str]) -> str:
    """The tag of a fleet: the same set of names, the same tag on every replica."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def _rows(tag: str, proxies: Sequence[FleetProxy]) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "provider": p.provider,
            "zone": p.zone,
            "labels": json.dumps(dict(p.labels)),
            "fleet": tag,
            # For the prober, which may serve another fleet (prober.py).
            "host": p.host,
            "port": p.port,
            "username": p.username,
            "password": p.password,
        }
        for p in proxies
    ]


async def register(
    store: PostgresStore, tag: str, proxies: Sequence[FleetProxy], removed: Sequence[str]
) -> int:
    """Registers the fleet `tag` (this replica's), adds or updates its proxies
    and drops `removed` (a fleet change seen here) with their leases and
    cooldowns; returns how many live leases that ended."""
    params = store.params() | {"fleet": tag}
    rows = _rows(tag, proxies)
    async with store.connection(transaction=True) as conn:
        await conn.execute(_REGISTER, params)
        revoked = await _remove(conn, params, list(removed))
        if rows:
            async with conn.cursor() as cur:
                await cur.executemany(_UPSERT, rows)
        # Many rows changed (a new fleet): fresh statistics, or the grant's
        # plan may take the whole fleet for one row and sort it each time.
        await conn.execute("ANALYZE discovery_proxies")
        return revoked


async def ensure(store: PostgresStore, tag: str, proxies: Sequence[FleetProxy]) -> None:
    """The maintenance's guard: the fleet `tag` registered again (it stays
    alive), and only those of its proxies the table lacks or holds otherwise
    written back. Usually there are none, so no proxy row is locked or
    rewritten: writing all of them every 30 s held every proxy row for the
    statement's length, and grants (proxy rows, then lease rows) and releases
    (lease rows, then proxy rows) deadlocked with it under load."""
    rows = _rows(tag, proxies)
    params = store.params() | {"fleet": tag}
    columns = ("name", "provider", "zone", "labels", "host", "port", "username", "password")
    arrays = {column: [row[column] for row in rows] for column in columns}
    async with store.connection(transaction=True) as conn:
        await conn.execute(_REGISTER, params)
        cur = await conn.execute(_DIFFERENT, params | arrays)
        different = {str(row[0]) for row in await cur.fetchall()}
    if different:
        await register(store, tag, [p for p in proxies if p.name in different], ())


async def forget_dead(store: PostgresStore) -> int:
    """Drops the fleets no replica registered for FLEET_TTL_S, and the proxies
    no fleet holds any more; returns how many live leases that ended."""
    params = store.params(ttl=FLEET_TTL_S)
    async with store.connection(transaction=True) as conn:
        dead = [row[0] for row in await (await conn.execute(_DEAD, params)).fetchall()]
        if not dead:
            return 0
        await conn.execute(_UNTAG, {"dead": dead})
        orphans = [row[0] for row in await (await conn.execute(_ORPHANS)).fetchall()]
        return await _remove(conn, params, orphans)


async def _remove(
    conn: psycopg.AsyncConnection[Any], params: dict[str, Any], names: list[str]
) -> int:
    if not names:
        return 0
    on = params | {"names": names}
    cur = await conn.execute(_REVOKE, on)
    await conn.execute(_REMOVE, on)
    return cur.rowcount


__all__ = ["FLEET_TTL_S", "digest", "forget_dead", "register"]
