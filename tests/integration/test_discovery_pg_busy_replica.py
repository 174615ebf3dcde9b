"""Issue 39, finding 3: a busy PostgreSQL replica called the database
unreachable. Requests that waited 2 s for a pooled connection answered 503
`store_unavailable`, and `/readyz` turned 503 ("PostgreSQL cannot be
reached") while the database answered at once, so a load balancer took the
replica out for being busy.

Here the pool is filled for real: a transaction of the test's holds one
lease's row, and more renewals of that lease than the pool has connections
wait on it (each holding a pooled connection) or wait for a connection. The
database itself answers every other statement meanwhile."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support.discovery import ServiceProcess, proxies, wait_for
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.replicas import replica, write
from tests.support.responders import Responders

pytestmark = pytest.mark.integration

POOL = 20  # PostgresStore's pool (max_size)
RENEWALS = 3 * POOL  # a pool's worth stuck in the database, the rest waiting for the pool


@pytest.fixture
def served(postgres: PostgresServer, tmp_path: Path) -> Iterator[tuple[ServiceProcess, str]]:
    database = postgres.fresh_database(f"busy_{random.randrange(1 << 30)}")
    responders = Responders.start(3)
    fleet = tmp_path / "fleet.json"
    write(fleet, responders.ports)
    server = replica(database, fleet, tmp_path / "replica.log")
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            wait_for(lambda: all(p["health"] == "healthy" for p in proxies(client).values()))
        yield server, database
    finally:
        server.stop()
        responders.stop()


def test_a_full_pool_is_overloaded_not_unreachable_and_the_replica_stays_ready(
    served: tuple[ServiceProcess, str],
) -> None:
    server, database = served
    with httpx.Client(base_url=server.url, timeout=5) as client:
        lease = client.post("/v1/leases", json={"holder": "h", "ttlSeconds": 300}).json()
    answers: list[httpx.Response] = []
    ready: list[tuple[int, str]] = []

    def renew(_: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            answers.append(client.post(f"/v1/leases/{lease['id']}/renew", json={}))

    with psycopg.connect(database) as holder, ThreadPoolExecutor(RENEWALS) as pool:
        holder.execute("SELECT id FROM discovery_leases WHERE id = %s FOR UPDATE", (lease["id"],))
        for i in range(RENEWALS):
            pool.submit(renew, i)
        # Until every renewal that found no pooled connection has answered
        # (2 s of waiting each), and a while after: readiness throughout.
        with httpx.Client(base_url=server.url, timeout=5) as client:
            deadline = time.monotonic() + 20
            while len(answers) < RENEWALS - POOL and time.monotonic() < deadline:
                answer = client.get("/readyz")
                ready.append((answer.status_code, answer.text))
                time.sleep(0.2)
            for _ in range(10):
                answer = client.get("/readyz")
                ready.append((answer.status_code, answer.text))
                time.sleep(0.2)
            busy = client.post("/v1/leases", json={"holder": "late"})
        holder.rollback()  # the renewals stuck in the database go through now
    refused = [a for a in answers if a.status_code != 200]
    assert len(refused) >= RENEWALS - POOL, [a.status_code for a in answers]
    for answer in [*refused, busy]:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "overloaded", answer.text
        assert answer.headers["retry-after"] == "1"
    assert [a.status_code for a in answers].count(200) == len(answers) - len(refused) > 0
    assert {status for status, _ in ready} == {200}, [t for s, t in ready if s != 200][:3]
    # Load, not an outage: a line now and then, not one error per refusal.
    events = [e["event"] for e in server.events()]
    assert "shared store unavailable" not in events
    lines = events.count("requests refused as overloaded: no database connection free in time")
    assert 0 < lines < len(refused)
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get("/readyz").status_code == 200
        again = client.post("/v1/leases", json={"holder": "after"})
        assert again.status_code == 201, again.text
