"""Issue 39, finding 5: proxies only a non-probing replica served were never
probed. Only the replica holding the probing lock probed, and only its own
fleet: another replica's five extra proxies stayed `unknown` for ever and
its grants on them answered 409 "5 not healthy". Now the probing replicas
share every proxy a live replica's fleet holds (issue 42: each its share),
and each says in its log which proxies only other replicas serve.

Two real replicas on the real PostgreSQL, with different fleet files, and
real CONNECT responders for every proxy."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest

from tests.support.discovery import ServiceProcess, manifest, proxies, proxy_entry, wait_for
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.replicas import replica
from tests.support.responders import Responders

pytestmark = pytest.mark.integration


def write_fleet(path: Path, ports: dict[str, int]) -> None:
    entries = [proxy_entry(n, port=p, labels={"slot": n}) for n, p in ports.items()]
    path.write_text(json.dumps(manifest(entries)))


def health(server: ServiceProcess) -> dict[str, str]:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        return {name: p["health"] for name, p in proxies(client).items()}


def probes(server: ServiceProcess) -> bool:
    return any(e["event"] == "probing a share of the fleet" for e in server.events())


def test_proxies_only_a_non_probing_replica_serves_are_probed(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    database = postgres.fresh_database(f"union_{random.randrange(1 << 30)}")
    shared, extra = Responders.start(3), Responders.start(5)
    common = {f"p{i}": port for i, port in enumerate(shared.ports)}
    only_b = {f"q{i}": port for i, port in enumerate(extra.ports)}
    fleet_a, fleet_b = tmp_path / "a.json", tmp_path / "b.json"
    write_fleet(fleet_a, common)
    write_fleet(fleet_b, common | only_b)
    a = replica(database, fleet_a, tmp_path / "a.log")
    b = replica(database, fleet_b, tmp_path / "b.log")
    try:
        a.start()
        wait_for(lambda: probes(a), timeout=10, what="replica a to probe")
        b.start()
        wait_for(
            lambda: set(health(b).values()) == {"healthy"},
            timeout=15,
            what="every proxy of b's fleet healthy",
        )
        assert probes(b)  # the two share them, b's extra proxies too
        with httpx.Client(base_url=b.url, timeout=5) as client:
            for name in only_b:
                got = client.post(
                    "/v1/leases", json={"holder": "h", "selector": {"labels": {"slot": name}}}
                )
                assert got.status_code == 201, got.text
        # The prober says which proxies it probes for other replicas, by name.
        said = [e for e in a.events() if e["event"].startswith("probing proxies that only")]
        assert said and said[-1]["proxies"] == ", ".join(sorted(only_b))
        # Probed for real: b's extra proxies going down is seen.
        extra.stop()
        wait_for(
            lambda: {health(b)[n] for n in only_b} == {"unhealthy"},
            timeout=15,
            what="b's extra proxies unhealthy",
        )
        assert set(health(a)) == set(common)  # a still serves only its own fleet
    finally:
        a.stop()
        b.stop()
        shared.stop()
        extra.stop()
