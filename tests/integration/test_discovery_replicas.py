"""Several `python -m discovery serve` replicas on one real PostgreSQL (Debian's,
started by scripts/postgres on loopback), under load from many clients:
no proxy granted twice at once (checked from the clients' side), any replica
serving any lease, a replica killed with SIGKILL, PostgreSQL restarted, the
fleet file changed under all of them, and every replica probing its share."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.discovery import (
    ROOT,
    ServiceProcess,
    free_port,
    proxies,
    wait_for,
)
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.replicas import INTERVAL, replica, write
from tests.support.responders import Responders

pytestmark = pytest.mark.integration

PROXIES = 12


@dataclass
class Cluster:
    url: str
    fleet: Path
    replicas: list[ServiceProcess]
    responders: list[Responders] = field(default_factory=list)

    def live(self) -> list[ServiceProcess]:
        return [r for r in self.replicas if r.process is not None and r.process.poll() is None]

    def probers(self) -> list[ServiceProcess]:
        """Replicas whose last probing event says they probe a share."""
        probing = []
        for member in self.live():
            said = [
                e["event"]
                for e in member.events()
                if e.get("logger") == "discovery.shared"
                and ("probing" in e["event"] or "stopped" in e["event"])
            ]
            if said and said[-1].startswith("probing"):
                probing.append(member)
        return probing

    def prober_of(self, name: str) -> ServiceProcess | None:
        """The live replica whose last share (its log names it whole) holds `name`."""
        for member in self.live():
            shares = [e for e in member.events() if e["event"] == "probing a share of the fleet"]
            if shares and name in shares[-1]["proxies"].split(", "):
                return member
        return None


@pytest.fixture
def cluster(postgres: PostgresServer, tmp_path: Path) -> Iterator[Cluster]:
    database = postgres.fresh_database(f"replicas_{random.randrange(1 << 30)}")
    responders = Responders.start(PROXIES)
    fleet = tmp_path / "fleet.json"
    write(fleet, responders.ports)
    replicas = [replica(database, fleet, tmp_path / f"replica{i}.log") for i in range(3)]
    # All three at once on an empty database: the migration runs once.
    for r in replicas:
        r.start(wait_ready=False)
    for r in replicas:
        r.wait_ready(30)
    running = Cluster(database, fleet, replicas, [responders])
    try:
        wait_for(lambda: all_healthy(running), timeout=20)
        yield running
    finally:
        for r in replicas:
            r.stop()
        for fake in running.responders:
            fake.stop()


def all_healthy(cluster: Cluster) -> bool:
    with httpx.Client(base_url=cluster.live()[0].url, timeout=5) as client:
        return all(p["health"] == "healthy" for p in proxies(client).values())


@dataclass
class Event:
    at: float
    kind: str  # "granted" (answer received) or "releasing" (before the request)
    proxy: str
    holder: str


@dataclass
class Load:
    """Clients that grant, hold a little and release, each on a random live
    replica, recording when they got a proxy and when they let it go."""

    cluster: Cluster
    clients: int = 24
    events: list[Event] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    retry_after: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(f"c{i}",), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _record(self, event: Event | None = None, status: int | None = None) -> None:
        with self.lock:
            if event is not None:
                self.events.append(event)
            if status is not None:
                self.statuses.append(status)

    def _url(self) -> str:
        return random.choice(self.cluster.live()).url

    def _client(self, holder: str) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    answer = client.post(
                        self._url() + "/v1/leases", json={"holder": holder, "ttlSeconds": 30}
                    )
                except httpx.TransportError:
                    continue  # a replica killed under us: the next try goes elsewhere
                self._record(status=answer.status_code)
                if answer.status_code != 201:
                    if "retry-after" in answer.headers:
                        with self.lock:
                            self.retry_after.add(answer.headers["retry-after"])
                    time.sleep(0.02)
                    continue
                lease = answer.json()
                self._record(Event(time.monotonic(), "granted", lease["proxy"]["name"], holder))
                time.sleep(random.uniform(0.005, 0.03))
                self._release(client, holder, lease)

    def _release(self, client: httpx.Client, holder: str, lease: dict[str, Any]) -> None:
        self._record(Event(time.monotonic(), "releasing", lease["proxy"]["name"], holder))
        for _ in range(100):  # until some replica has answered (PostgreSQL may be down)
            try:
                answer = client.delete(f"{self._url()}/v1/leases/{lease['id']}")
            except httpx.TransportError:
                continue
            self._record(status=answer.status_code)
            if answer.status_code in (204, 404):
                return
            time.sleep(0.2)

    def double_grants(self) -> list[str]:
        """Grants of a proxy answered while its previous holder had not yet
        started to release it."""
        found = []
        holding: dict[str, str] = {}
        for event in sorted(self.events, key=lambda e: (e.at, e.kind != "releasing")):
            if event.kind == "granted":
                if event.proxy in holding:
                    found.append(f"{event.proxy}: {event.holder} while {holding[event.proxy]}")
                holding[event.proxy] = event.holder
            elif holding.get(event.proxy) == event.holder:
                del holding[event.proxy]
        return found

    def grants(self) -> int:
        return sum(1 for e in self.events if e.kind == "granted")


def same_view_everywhere(cluster: Cluster) -> list[dict[str, Any]]:
    """GET /v1/proxies of every live replica, which must agree. Each prober
    writes health once a second, so views read a moment apart may differ by
    a latency: read again until one set of reads agrees."""
    views: list[list[dict[str, Any]]] = []
    for _ in range(20):
        views = []
        for r in cluster.live():
            with httpx.Client(base_url=r.url, timeout=5) as client:
                views.append(client.get("/v1/proxies").json()["proxies"])
        if all(v == views[0] for v in views):
            return views[0]
        time.sleep(0.1)
    raise AssertionError(f"GET /v1/proxies differs between replicas: {views}")


def test_replicas_never_grant_one_proxy_twice_under_load(
    cluster: Cluster, postgres: PostgresServer
) -> None:
    with Load(cluster) as load:
        time.sleep(6)
    assert load.grants() > 300, load.grants()
    assert load.double_grants() == []
    assert 409 in load.statuses and load.retry_after  # more clients than proxies
    assert set(load.statuses) <= {201, 204, 409}
    # Every lease was given back: nothing is leased, on any replica, and all agree.
    wait_for(lambda: not any(p["leased"] for p in same_view_everywhere(cluster)), timeout=10)
    # The three replicas started together; the schema was made once.
    count = postgres.psql("SELECT count(*) FROM discovery_schema", database=db_name(cluster))
    assert count.strip() == "1"
    assert len(cluster.probers()) == 3  # every replica probes its share


def db_name(cluster: Cluster) -> str:
    return cluster.url.rsplit("/", 1)[1]


def test_any_replica_serves_a_lease_and_expiry_is_the_database_s(cluster: Cluster) -> None:
    first, second, third = (httpx.Client(base_url=r.url, timeout=5) for r in cluster.replicas)
    with first, second, third:
        lease = first.post("/v1/leases", json={"holder": "h", "target": "shop.example"}).json()
        renewed = second.post(f"/v1/leases/{lease['id']}/renew", json={"ttlSeconds": 20})
        assert renewed.status_code == 200 and renewed.json()["proxy"] == lease["proxy"]
        blocked = {"outcome": "blocked", "target": "https://shop.example/item"}
        assert third.post(f"/v1/leases/{lease['id']}/report", json=blocked).status_code == 204
        name = lease["proxy"]["name"]
        for client in (first, second, third):
            view = proxies(client)[name]
            assert view["leased"] and view["cooldowns"][0]["target"] == "shop.example"
        assert second.delete(f"/v1/leases/{lease['id']}").status_code == 204
        assert first.delete(f"/v1/leases/{lease['id']}").status_code == 404
        # Cooling down for shop.example on every replica: never granted for it.
        for client in (first, second, third):
            got = client.post("/v1/leases", json={"holder": "h", "target": "shop.example"})
            assert got.json()["proxy"]["name"] != name
            client.delete(f"/v1/leases/{got.json()['id']}")
        short = first.post("/v1/leases", json={"holder": "h", "ttlSeconds": 1}).json()
        time.sleep(1.5)
        assert third.post(f"/v1/leases/{short['id']}/renew", json={}).status_code == 404
        # Bad input on a replica is a 400, not a 500.
        bad = second.post("/v1/leases", json={"holder": "h", "ttlSeconds": -5})
        assert bad.status_code == 400 and bad.json()["error"] == "bad_request"
        assert second.post("/v1/leases/x/report", json={"outcome": "maybe"}).status_code == 400


def test_the_status_page_data_is_the_same_on_every_replica(cluster: Cluster) -> None:
    """The page's data (`/ui/api/status`) comes from the shared database: a
    lease and a ban made on one replica show on every one, with the holder,
    the cooldown's site and the prober's recent probe times."""
    clients = [httpx.Client(base_url=r.url, timeout=5) for r in cluster.replicas]
    try:
        first = clients[0]
        lease = first.post("/v1/leases", json={"holder": "page-holder", "target": "shop.example"})
        lease_id, name = lease.json()["id"], lease.json()["proxy"]["name"]
        blocked = {"outcome": "blocked", "target": "shop.example"}
        assert first.post(f"/v1/leases/{lease_id}/report", json=blocked).status_code == 204

        def status(client: httpx.Client, query: str = "") -> dict[str, Any]:
            answer = client.get("/ui/api/status" + query)
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        def probed(client: httpx.Client) -> bool:
            return all(p["recentMs"] for p in status(client, "?limit=500")["proxies"])

        for client in clients:
            wait_for(lambda client=client: probed(client), timeout=10)  # type: ignore[misc]
            view = status(client, "?state=leased")
            assert view["totals"] | {"grantsPerMinute": 0} == {
                "proxies": PROXIES,
                "healthy": PROXIES,
                "unhealthy": 0,
                "unknown": 0,
                "leased": 1,
                "cooling": 1,
                "grantsPerMinute": 0,
            }
            [row] = view["proxies"]
            assert row["name"] == name and row["lease"]["holder"] == "page-holder"
            assert [c["target"] for c in row["cooldowns"]] == ["shop.example"]
        assert first.delete(f"/v1/leases/{lease_id}").status_code == 204
        for client in clients:
            assert status(client, "?state=leased")["matching"] == 0
    finally:
        for client in clients:
            client.close()


def test_a_replica_killed_under_load_loses_nothing_and_its_probing_is_taken_over(
    cluster: Cluster,
) -> None:
    wait_for(lambda: len(cluster.probers()) == 3, timeout=10)
    first = cluster.live()[0]
    with httpx.Client(base_url=first.url, timeout=5) as client:
        held = client.post("/v1/leases", json={"holder": "keeper", "ttlSeconds": 60}).json()
        cooled = client.post("/v1/leases", json={"holder": "keeper", "ttlSeconds": 60}).json()
        assert (
            client.post(
                f"/v1/leases/{cooled['id']}/report", json={"outcome": "blocked"}
            ).status_code
            == 204
        )
    # A proxy that will go down once its prober is gone: someone must probe it.
    victim = Responders.start(1)
    cluster.responders.append(victim)
    ports = [*cluster.responders[0].ports, victim.ports[0]]
    write(cluster.fleet, ports)
    wait_for(lambda: len(same_view_everywhere(cluster)) == PROXIES + 1, timeout=10)
    wait_for(lambda: cluster.prober_of(f"p{PROXIES}") is not None, timeout=10)
    prober = cluster.prober_of(f"p{PROXIES}")
    assert prober is not None
    with Load(cluster) as load:
        time.sleep(1.5)
        prober.kill()
        killed_at = time.monotonic()
        wait_for(lambda: cluster.prober_of(f"p{PROXIES}") is not None, timeout=5)
        took_over = time.monotonic() - killed_at
        victim.stop()
        wait_for(lambda: proxies_of(cluster)[f"p{PROXIES}"]["health"] == "unhealthy", timeout=10)
        time.sleep(1.5)
    assert took_over < 2 * float(INTERVAL) + 1, took_over
    assert load.double_grants() == []
    survivors = cluster.live()
    assert len(survivors) == 2
    with httpx.Client(base_url=survivors[0].url, timeout=5) as client:
        # The killed replica's lease lives on, renewable elsewhere; its cooldown too.
        assert client.post(f"/v1/leases/{held['id']}/renew", json={}).status_code == 200
        view = proxies(client)
        assert view[held["proxy"]["name"]]["leased"]
        assert view[cooled["proxy"]["name"]]["cooldowns"][0]["target"] == "*"
    same_view_everywhere(cluster)


def proxies_of(cluster: Cluster) -> dict[str, dict[str, Any]]:
    with httpx.Client(base_url=cluster.live()[0].url, timeout=5) as client:
        return proxies(client)


def test_postgresql_restarted_under_load_is_a_503_then_recovered(
    cluster: Cluster, postgres: PostgresServer
) -> None:
    with httpx.Client(base_url=cluster.replicas[0].url, timeout=5) as client:
        kept = client.post("/v1/leases", json={"holder": "keeper", "ttlSeconds": 120}).json()
    with Load(cluster, clients=8) as load:
        time.sleep(1)
        postgres.stop()
        down: list[httpx.Response] = []
        for r in cluster.replicas:
            with httpx.Client(base_url=r.url, timeout=10) as client:
                down.append(client.post("/v1/leases", json={"holder": "h"}))
        time.sleep(1)
        postgres.start()
        before = load.grants()
        wait_for(lambda: load.grants() > before + 20, timeout=20)
    assert [a.status_code for a in down] == [503, 503, 503]
    assert all(a.headers.get("retry-after") == "1" for a in down)
    assert all(a.json()["error"] == "store_unavailable" for a in down)
    assert 503 in load.statuses and 500 not in load.statuses
    assert load.double_grants() == []
    with httpx.Client(base_url=cluster.replicas[2].url, timeout=5) as client:
        assert client.post(f"/v1/leases/{kept['id']}/renew", json={}).status_code == 200
    # All the load's leases given back: only the kept one is held.
    wait_for(lambda: sum(p["leased"] for p in same_view_everywhere(cluster)) == 1, timeout=15)


def test_a_fleet_change_reaches_every_replica_and_keeps_remaining_leases(
    cluster: Cluster,
) -> None:
    first, second = (httpx.Client(base_url=r.url, timeout=5) for r in cluster.replicas[:2])
    with first, second:
        leases = [
            first.post(
                "/v1/leases", json={"holder": "h", "selector": {"labels": {"slot": n}}}
            ).json()
            for n in ("p0", "p1")
        ]
        ports = cluster.responders[0].ports
        write(cluster.fleet, ports[1:], [f"p{i}" for i in range(1, PROXIES)])  # p0 leaves
        wait_for(lambda: all("p0" not in proxies_of_replica(r) for r in cluster.replicas))
        assert second.post(f"/v1/leases/{leases[0]['id']}/renew", json={}).status_code == 404
        assert second.post(f"/v1/leases/{leases[1]['id']}/renew", json={}).status_code == 200
        assert proxies(first)["p1"]["leased"]


def proxies_of_replica(replica: ServiceProcess) -> dict[str, dict[str, Any]]:
    with httpx.Client(base_url=replica.url, timeout=5) as client:
        return proxies(client)


def test_bad_db_values_are_refused_and_create_nothing(tmp_path: Path, refused: str) -> None:
    fleet = tmp_path / "fleet.json"
    write(fleet, [9])
    base = [sys.executable, "-m", "discovery", "serve", "--fleet", str(fleet)]
    base += ["--listen", f"127.0.0.1:{free_port()}"]
    for db, code, message in (
        ("mysql://u@127.0.0.1/x", 2, "'mysql' is not a supported database"),
        ("postgresql:127.0.0.1/x", 2, "is not a valid URL"),
        (str(fleet / "x.db"), 2, "is a file, not a directory"),
        (f"postgresql://nobody:s3cret-pw@{refused}/x", 1, "cannot"),
    ):
        done = subprocess.run(
            [*base, "--db", db],
            cwd=tmp_path,  # where a URL taken for a path would have made a directory
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == code, (db, done.stderr)
        assert message in done.stderr, done.stderr
        assert "s3cret-pw" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.json"]
