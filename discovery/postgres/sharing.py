"""Which replica probes which proxy: the fleet shared between the live
replicas on PostgreSQL.

A replica probes while it holds a probing slot: a session advisory lock
(PROBER_CLASS, slot) on its own connection (prober.py). The live slots
are the granted locks of that class in this database (pg_locks), so the set
of probers is what PostgreSQL itself holds: a replica killed loses its slot
when its connection dies, with no heartbeat table to expire.

Each proxy belongs to the live slot with the highest score for it
(rendezvous hashing, `owner`): every replica computes the same owner from
the same slots, so each proxy has one prober; a slot that comes or goes
moves only the proxies it wins or held (about 1/n of the fleet), the rest
keep their prober and their schedule. Scores come from a digest of the
name, not Python's hash(), which differs between processes."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

PROBER_CLASS = 0x6567  # advisory lock (class, slot) of each probing replica
MAX_SLOTS = 1024  # replicas that can probe at once; any further one waits for a slot

# The probing slots held in this database (advisory locks are per database).
LIVE_SLOTS = """SELECT objid::int AS slot FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = %(class)s::oid
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY 1"""
TRY_SLOT = "SELECT pg_try_advisory_lock(%(class)s, %(slot)s)"
# PostgreSQL notices a replica gone without a word (host down, network cut)
# by TCP keepalive on the slot's connection: about 5 + 5 x 1 s, not the
# system's two hours. A killed process's socket closes at once.
KEEPALIVE = (
    "SET tcp_keepalives_idle = 5",
    "SET tcp_keepalives_interval = 1",
    "SET tcp_keepalives_count = 5",
)
_MASK = (1 << 64) - 1


@functools.lru_cache(maxsize=1 << 17)  # a fleet's names, computed again at every split
def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _score(key: int, slot: int) -> int:
    """A well-mixed 64-bit score of (name, slot): splitmix64's finaliser."""
    z = (key ^ (slot * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def owner(name: str, slots: Sequence[int]) -> int:
    """The slot that probes `name` among the live `slots` (not empty)."""
    key = _name_key(name)
    return max(slots, key=lambda slot: (_score(key, slot), slot))


def share(names: Iterable[str], slot: int, slots: Sequence[int]) -> set[str]:
    """The names of `names` that `slot` probes when `slots` are live."""
    if slot not in slots:
        return set()
    if len(slots) == 1:
        return set(names)
    return {name for name in names if owner(name, slots) == slot}


async def live_slots(conn: psycopg.AsyncConnection[Any]) -> list[int]:
    rows = await (await conn.execute(LIVE_SLOTS, {"class": PROBER_CLASS})).fetchall()
    return [int(row[0]) for row in rows]


async def take_slot(conn: psycopg.AsyncConnection[Any]) -> int | None:
    """Locks the lowest free slot on `conn` (held as long as the session);
    None when all MAX_SLOTS are taken."""
    taken = set(await live_slots(conn))
    for slot in range(MAX_SLOTS):
        if slot in taken:
            continue
        row = await (await conn.execute(TRY_SLOT, {"class": PROBER_CLASS, "slot": slot})).fetchone()
        if row and row[0]:
            for statement in KEEPALIVE:
                await conn.execute(statement)
            return slot
        # Taken by another replica since the read: try the next.
    return None


__all__ = [
    "MAX_SLOTS",
    "PROBER_CLASS",
    "live_slots",
    "owner",
    "share",
    "take_slot",
]
