"""A release that PostgreSQL aborts to break a deadlock is run again, not
answered 503 (discovery/postgres/conflicts.py). Seen under load: a batch of
128 releases answered 503 at once with "deadlock detected".

Here the cycle is made on purpose, on a real replica and a real PostgreSQL:
another session locks the lease's proxy row; the release ends the lease row
and waits for the proxy row; the other session then wants the lease row.
PostgreSQL finds the cycle after `deadlock_timeout` in the release's session,
which waited first (the other session's own timeout is set far longer), and
aborts the release; the other session rolls back."""

from __future__ import annotations

import random
import time
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


def _waiting_for_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%discovery_leases%'"
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_release_aborted_to_break_a_deadlock_is_run_again(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    database = postgres.fresh_database(f"deadlock_{random.randrange(1 << 30)}")
    responders = Responders.start(2)
    fleet = tmp_path / "fleet.json"
    server: ServiceProcess | None = None
    try:
        write(fleet, responders.ports)
        server = replica(database, fleet, tmp_path / "replica.log").start()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            wait_for(lambda: all(p["health"] == "healthy" for p in proxies(client).values()))
            lease = client.post("/v1/leases", json={"holder": "h"}).json()
            other = psycopg.connect(database)
            other.execute("SET statement_timeout = '20s'")
            # Its own check for the cycle long after the release's (1 s, the
            # default): on a busy machine the release's session may otherwise
            # run its check late, find the cycle second and abort this one.
            other.execute("SET deadlock_timeout = '10s'")
            # The lease's proxy row, locked by another session's open transaction.
            other.execute(
                "UPDATE discovery_proxies SET last_used = last_used WHERE name = %s",
                (lease["proxy"]["name"],),
            )
            with ThreadPoolExecutor(1) as pool:
                released = pool.submit(client.delete, f"/v1/leases/{lease['id']}")
                wait_for(lambda: _waiting_for_a_lock(database), timeout=10)
                started = time.monotonic()
                # The release holds the lease row and waits for the proxy row;
                # this waits for the lease row: a cycle, which PostgreSQL
                # breaks by aborting the release (it waited first).
                other.execute("DELETE FROM discovery_leases WHERE id = %s", (lease["id"],))
                assert time.monotonic() - started < 15
                other.rollback()  # the lease is as it was; the retried release ends it
                other.close()
                answer = released.result(timeout=30)
            assert answer.status_code == 204, answer.text
            gone = client.delete(f"/v1/leases/{lease['id']}")
            assert gone.status_code == 404, gone.text
        log = (tmp_path / "replica.log").read_text()
        assert "deadlock detected" in log and "statement run again" in log, log[-3000:]
    finally:
        if server is not None:
            server.stop()
        responders.stop()
