"""Issue 39, finding 4: on PostgreSQL a lease that answered 404 came back. A
replica restarted with a fleet that lacked the lease's proxy answered 404
to its renewal and release; once the proxy was back in the fleet, renewing
the old lease answered 200 and a new grant on the proxy got 409 (the old
fleet's tag lived on in the database for minutes). The contract, and
SQLite: 404 means the lease has ended, for good."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.discovery import ServiceProcess, proxies, wait_for
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.replicas import replica, write
from tests.support.responders import Responders

pytestmark = pytest.mark.integration

ON_P4 = {"holder": "h", "ttlSeconds": 120, "selector": {"labels": {"slot": "p4"}}}


def healthy(server: ServiceProcess, names: set[str]) -> bool:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        listed = proxies(client)
    return set(listed) == names and all(p["health"] == "healthy" for p in listed.values())


def test_a_lease_that_answered_404_stays_ended_when_its_proxy_is_back(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    database = postgres.fresh_database(f"ended_{random.randrange(1 << 30)}")
    responders = Responders.start(5)
    fleet = tmp_path / "fleet.json"
    names = {f"p{i}" for i in range(5)}
    servers: list[ServiceProcess] = []

    def start() -> ServiceProcess:
        server = replica(database, fleet, tmp_path / f"replica{len(servers)}.log")
        servers.append(server)
        return server.start()

    try:
        write(fleet, responders.ports)
        first = start()
        wait_for(lambda: healthy(first, names))
        with httpx.Client(base_url=first.url, timeout=5) as client:
            lease: dict[str, Any] = client.post("/v1/leases", json=ON_P4).json()
        assert lease["proxy"]["name"] == "p4"
        assert first.terminate() == 0

        write(fleet, responders.ports[:4])  # restarted without p4
        second = start()
        with httpx.Client(base_url=second.url, timeout=5) as client:
            renewed = client.post(f"/v1/leases/{lease['id']}/renew", json={})
            assert renewed.status_code == 404, renewed.text
            assert client.delete(f"/v1/leases/{lease['id']}").status_code == 404

            write(fleet, responders.ports)  # p4 is back
            wait_for(lambda: healthy(second, names), timeout=15)
            again = client.post(f"/v1/leases/{lease['id']}/renew", json={})
            assert again.status_code == 404, again.text
            assert client.delete(f"/v1/leases/{lease['id']}").status_code == 404
            granted = client.post("/v1/leases", json=ON_P4)
            assert granted.status_code == 201, granted.text
            assert granted.json()["proxy"]["name"] == "p4"
            assert granted.json()["id"] != lease["id"]
    finally:
        for server in servers:
            server.stop()
        responders.stop()
