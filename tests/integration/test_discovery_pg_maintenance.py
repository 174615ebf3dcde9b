"""The PostgreSQL book's maintenance (every 30 s on each replica) writes back
only the fleet's proxies the table lacks or holds otherwise (fleets.ensure):
it rewrote every proxy row, holding all of them for the statement's length,
and grants and releases deadlocked with it under load (503s for whole
batches; tests/integration/test_discovery_pg_deadlock.py)."""

from __future__ import annotations

import random

from tests.support.lease_world import Books, World, simple_fleet
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres

VERSIONS = "SELECT name, xmin::text, xmax::text FROM discovery_proxies ORDER BY name"


def test_maintenance_writes_back_only_what_differs(postgres: PostgresServer) -> None:
    books = Books("postgres", postgres.fresh_database(f"maint_{random.randrange(1 << 30)}"))

    async def scenario(w: World) -> None:
        hosts = dict(w.rows("SELECT name, host FROM discovery_proxies"))
        before = w.rows(VERSIONS)
        await w.book.maintain()
        # Nothing differed: no row rewritten (xmin) nor locked (xmax).
        assert w.rows(VERSIONS) == before
        # Another replica's older fleet removed p1 and wrote p0 otherwise.
        w.rows("DELETE FROM discovery_proxies WHERE name = 'p1' RETURNING name")
        w.rows("UPDATE discovery_proxies SET host = '10.9.9.9' WHERE name = 'p0' RETURNING name")
        await w.book.maintain()
        assert dict(w.rows("SELECT name, host FROM discovery_proxies")) == hosts

    books.run(simple_fleet(3), scenario)
