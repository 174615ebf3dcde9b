"""A recycle as the lease service and a crawler see it: the fleet manifest
swaps `home-0` for `home-0-g2` (a new generation: a new name, id and
address) while a crawler holds a lease on `home-0`.

What docs/discovery.md promises for a proxy that left the fleet holds: the
old lease's renewal and report are answered 404 `lease_not_found`, and the
client package (httpx transport, as crawlers install it) learns it at its
next renewal and sends the next request through another proxy, without an
error, although the old proxy is gone for good. On both stores.

Real squids (tests/support/crawlsite.py, each reaching the site from an
address of its own, so the site knows which proxy a page came through), the
real app in a thread; health verdicts from a fake (all healthy): the test is
about leases, not probing.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.database import PostgresUrl
from egress_proxies_client import DiscoveryTransport
from tests.support.crawlsite import PASSWORD, BanningSite, Proxy, start_proxies
from tests.support.discovery import ServerThread, proxy_entry, settings_for, wait_for, write_fleet
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

TTL = 3  # seconds: the client renews after about 2, so it learns soon
SITE_LIMIT = 100  # pages per address: no ban in this test


@pytest.fixture
def squids() -> Iterator[dict[str, Proxy]]:
    """home-0, home-1 and the new generation home-0-g2, each its own squid and
    address (per test: the test stops home-0's)."""
    with start_proxies(3) as running:
        yield dict(zip(("home-0", "home-1", "home-0-g2"), running, strict=True))


def entries(squids: dict[str, Proxy], *names: str) -> list[dict[str, Any]]:
    return [
        proxy_entry(
            name,
            port=squids[name].squid.port,
            provider="home",
            username="crawler",
            password=PASSWORD,
        )
        for name in names
    ]


def listed(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in http.get("/v1/proxies").json()["proxies"]}


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_lease_on_a_recycled_proxy_ends_and_the_client_goes_on_through_another(
    tmp_path: Path, request: pytest.FixtureRequest, squids: dict[str, Proxy], store: str
) -> None:
    db: Any = tmp_path / "leases.db"
    if store == "postgres":
        server: Any = request.getfixturevalue("postgres")
        db = PostgresUrl(server.fresh_database(f"generations_{random.randrange(1 << 30)}"))
    settings = settings_for(tmp_path, db=db, max_lease_ttl=60)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, entries(squids, "home-0", "home-1"))
    with (
        ServerThread(settings) as service,
        httpx.Client(base_url=service.url, timeout=10) as http,
        BanningSite(SITE_LIMIT) as site,
    ):
        transport = DiscoveryTransport(service.url, ttl=TTL, per_site=1, holder="crawler-a")
        with httpx.Client(transport=transport, timeout=20) as crawler:
            first = crawler.get(f"{site.base}/page/0")
            assert first.status_code == 200
            [held] = transport.pool.leases()
            assert held.name == "home-0"  # never-leased proxies first, by name
            assert site.served == {squids["home-0"].address: 1}

            # The recycle: the stack's next manifest has the new generation in
            # the old one's place, and the old machine is gone.
            write_fleet(settings.fleet_file, entries(squids, "home-0-g2", "home-1"))
            wait_for(lambda: set(listed(http)) == {"home-0-g2", "home-1"}, what="the new fleet")
            squids["home-0"].squid.stop()

            for path, body in (("renew", {}), ("report", {"outcome": "ok"})):
                answer = http.post(f"/v1/leases/{held.id}/{path}", json=body)
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"] == "lease_not_found"

            # The client's next renewal says the lease is gone: it drops it...
            wait_for(lambda: not transport.pool.leases(), timeout=3 * TTL, what="the lease lost")
            assert transport.stats["leases/lost"] == 1
            # ...and the next page goes through another proxy, with no error.
            second = crawler.get(f"{site.base}/page/1")
            assert second.status_code == 200
            [now] = transport.pool.leases()
            assert now.name == "home-0-g2"
            assert site.served == {squids["home-0"].address: 1, squids["home-0-g2"].address: 1}
        assert not any(p["leased"] for p in listed(http).values())
        assert "discovery_leases_revoked_total 1.0" in http.get("/metrics").text
