"""Issue 42, point 3: what a replica does with its share of the fleet, round
by round (discovery/postgres/prober.py), on the real PostgreSQL: two
replicas' probers in this process, each on its own slot connection, their
rounds driven by the test (`step`: the slot and the live slots; `sync`:
health out, error reports in). Each engine is given its share alone, each
replica writes health only for its share and takes only its share's error
reports (the other's stay in the database for it), and a replica gone
leaves its share to the other at the other's next round.

The real replicas, with probes counted at the proxies, are
test_discovery_pg_probe_sharing.py."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from discovery.book.rules import Terms
from discovery.database import PostgresUrl
from discovery.metrics import Metrics
from discovery.postgres.backend import PostgresBackend
from discovery.postgres.prober import Prober
from tests.support.discovery import FakeHealth
from tests.support.lease_world import Listener, simple_fleet
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

FLEET = simple_fleet(12)
NAMES = set(FLEET.proxies)
TERMS = Terms(max_ttl=60, cooldown=60, probe_interval=5.0)


class Replica:
    def __init__(self, url: str) -> None:
        self.url = url
        self.backend = PostgresBackend(PostgresUrl(url), TERMS)
        self.health = FakeHealth(Listener())
        self.slot_conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def prober(self) -> Prober:
        assert self.backend.prober is not None
        return self.backend.prober

    async def start(self) -> None:
        self.backend.open()
        await self.backend.start(FLEET, self.health, Metrics(CollectorRegistry()))
        self.slot_conn = await self.backend.store.connect_alone()

    async def step(self) -> None:
        assert self.slot_conn is not None
        await self.prober.step(self.slot_conn)

    async def die(self) -> None:
        """Its slot's connection closes, as when its process is killed; back
        once PostgreSQL has ended that session (and released its slot), which
        the server does a moment after the socket closes."""
        assert self.slot_conn is not None
        backend = self.slot_conn.info.backend_pid
        await self.slot_conn.close()
        for _ in range(100):
            with psycopg.connect(self.url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE pid = %s", (backend,)
                ).fetchone()
            if row is not None and row[0] == 0:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"PostgreSQL kept session {backend}'s locks for 5 s")

    async def stop(self) -> None:
        if self.slot_conn is not None and not self.slot_conn.closed:
            await self.slot_conn.close()
        await self.backend.stop()


def rows(url: str, sql: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        return {r[0]: r[1] for r in conn.execute(sql).fetchall()}


def two_replicas(
    postgres: PostgresServer, scenario: Callable[[str, Replica, Replica], Awaitable[None]]
) -> None:
    url = postgres.fresh_database(f"share_rounds_{random.randrange(1 << 30)}")

    async def run() -> None:
        a, b = Replica(url), Replica(url)
        try:
            await a.start()
            await b.start()
            await a.step()
            await b.step()
            await a.step()  # a sees b's slot
            await scenario(url, a, b)
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(run())


def test_each_replica_probes_writes_and_takes_reports_of_its_share_alone(
    postgres: PostgresServer,
) -> None:
    async def scenario(url: str, a: Replica, b: Replica) -> None:
        mine_a, mine_b = a.prober.share, b.prober.share
        assert mine_a and mine_b and not mine_a & mine_b and mine_a | mine_b == NAMES
        # Each engine is given its share alone.
        assert set(a.health.states) == mine_a and set(b.health.states) == mine_b
        # A crawler's `error` report on every proxy, through any replica's store.
        async with a.backend.store.statements() as db:
            for name in sorted(NAMES):
                await db.add_error(name, f"refused by {name}")
        await a.prober.sync()
        # a writes its share's health, takes its share's reports; b's stay.
        health = rows(url, "SELECT name, health FROM discovery_proxies")
        assert {n for n, h in health.items() if h == "healthy"} == mine_a
        assert sorted(a.health.errors) == sorted((n, f"refused by {n}") for n in mine_a)
        waiting = rows(url, "SELECT name, error_reports FROM discovery_proxies")
        assert {n for n, count in waiting.items() if count} == mine_b
        await b.prober.sync()
        assert sorted(b.health.errors) == sorted((n, f"refused by {n}") for n in mine_b)
        health = rows(url, "SELECT name, health FROM discovery_proxies")
        assert set(health.values()) == {"healthy"}

    two_replicas(postgres, scenario)


def test_a_replica_gone_the_other_takes_its_share_at_its_next_round(
    postgres: PostgresServer,
) -> None:
    async def scenario(url: str, a: Replica, b: Replica) -> None:
        mine_b = b.prober.share
        await b.die()
        await a.step()
        assert a.prober.share == NAMES
        assert set(a.health.states) == NAMES  # b's proxies new to a: probed at once
        # A replica started again takes the free slot and only what it wins.
        again = Replica(url)
        try:
            await again.start()
            await again.step()
            await a.step()
            assert again.prober.share == mine_b  # b's slot, b's share
            assert a.prober.share == NAMES - mine_b
        finally:
            await again.stop()

    two_replicas(postgres, scenario)
