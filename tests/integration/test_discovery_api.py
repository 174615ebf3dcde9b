"""The HTTP API on a loopback socket (the real app under uvicorn, real HTTP with
httpx); health verdicts come from a fake so the tests are about leases."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.database import PostgresUrl
from egress_proxies_client import NoProxyAvailable, lease
from health.model import Health
from tests.support.discovery import ServerThread, proxy_entry, settings_for, wait_for, write_fleet
from tests.support.postgres import postgres as postgres

PASSWORD = "pw-0f-the-proxy"


def parse_time(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def seconds_until(text: str) -> float:
    return (parse_time(text) - datetime.now(UTC)).total_seconds()


def assert_error(answer: httpx.Response, status: int, code: str | None = None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    assert set(body) == {"error", "detail"}, body
    assert isinstance(body["error"], str) and isinstance(body["detail"], str)
    if code is not None:
        assert body["error"] == code


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    options: dict[str, Any] = {"max_lease_ttl": 60, "lease_cooldown": 30}
    options.update(getattr(request, "param", {}))
    count = options.pop("proxies", 1)
    settings = settings_for(tmp_path, **options)
    assert settings.fleet_file is not None
    write_fleet(
        settings.fleet_file,
        [
            proxy_entry(f"p{i}", port=4000 + i, username="crawler", password=PASSWORD)
            for i in range(count)
        ],
    )
    with ServerThread(settings) as running:
        yield running


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def sqlite_path(server: ServerThread) -> Path:
    assert isinstance(server.settings.db, Path)  # these servers run on SQLite
    return server.settings.db


def store_state(server: ServerThread) -> tuple[Any, ...]:
    with sqlite3.connect(sqlite_path(server)) as db:
        return tuple(
            db.execute(sql).fetchall()
            for sql in (
                "SELECT * FROM leases ORDER BY id",
                "SELECT * FROM cooldowns ORDER BY proxy, target",
                "SELECT count(*) FROM reports",
            )
        )


# -- the life of a lease --------------------------------------------------------------------


def test_grant_renew_report_blocked_release(server: ServerThread, http: httpx.Client) -> None:
    granted = http.post(
        "/v1/leases", json={"holder": "crawler-7", "ttlSeconds": 20, "target": "example.com"}
    )
    assert granted.status_code == 201
    body = granted.json()
    assert set(body) == {"id", "holder", "proxy", "expiresAt"}
    assert body["holder"] == "crawler-7"
    assert body["proxy"] == {"name": "p0", "url": f"http://crawler:{PASSWORD}@127.0.0.1:4000"}
    assert 18 < seconds_until(body["expiresAt"]) <= 20
    lease_id = body["id"]

    renewed = http.post(f"/v1/leases/{lease_id}/renew", json={"ttlSeconds": 3600})
    assert renewed.status_code == 200
    assert renewed.json()["id"] == lease_id
    assert 58 < seconds_until(renewed.json()["expiresAt"]) <= 60  # never past --max-lease-ttl
    again = http.post(f"/v1/leases/{lease_id}/renew")  # no body: the lease's TTL
    assert again.status_code == 200

    reported = http.post(
        f"/v1/leases/{lease_id}/report",
        json={"outcome": "blocked", "target": "https://example.com/some/page"},
    )
    assert reported.status_code == 204
    assert http.delete(f"/v1/leases/{lease_id}").status_code == 204
    assert_error(http.delete(f"/v1/leases/{lease_id}"), 404, "lease_not_found")

    # Cooling down for example.com (30 s): 409 with Retry-After for that target...
    denied = http.post("/v1/leases", json={"holder": "c2", "target": "https://example.com/"})
    assert_error(denied, 409, "no_proxy_available")
    assert 29 <= int(denied.headers["retry-after"]) <= 30
    # ...while another target still gets the proxy.
    other = http.post("/v1/leases", json={"holder": "c3", "target": "example.org"})
    assert other.status_code == 201 and other.json()["proxy"]["name"] == "p0"

    [proxy] = http.get("/v1/proxies").json()["proxies"]
    assert proxy["leased"] is True
    assert [c["target"] for c in proxy["cooldowns"]] == ["example.com"]
    assert 28 < seconds_until(proxy["cooldowns"][0]["until"]) <= 30


def test_leases_expire_on_their_own(server: ServerThread, http: httpx.Client) -> None:
    lease_id = http.post("/v1/leases", json={"holder": "c", "ttlSeconds": 1}).json()["id"]
    assert http.get("/v1/proxies").json()["proxies"][0]["leased"] is True
    wait_for(lambda: http.get("/v1/proxies").json()["proxies"][0]["leased"] is False, timeout=5)
    assert_error(http.post(f"/v1/leases/{lease_id}/renew"), 404)
    metrics = http.get("/metrics").text
    assert "discovery_leases_expired_total 1.0" in metrics
    assert http.post("/v1/leases", json={"holder": "c"}).status_code == 201


def test_retry_after_counts_down_to_the_lease_expiry(http: httpx.Client) -> None:
    http.post("/v1/leases", json={"holder": "c", "ttlSeconds": 12})
    denied = http.post("/v1/leases", json={"holder": "d"})
    assert_error(denied, 409)
    assert denied.headers["retry-after"] in ("12", "11")


def test_error_report_counts_against_health(server: ServerThread, http: httpx.Client) -> None:
    lease_id = http.post("/v1/leases", json={"holder": "c"}).json()["id"]
    answer = http.post(f"/v1/leases/{lease_id}/report", json={"outcome": "error"})
    assert answer.status_code == 204
    assert server.fake is not None
    assert server.fake.errors == [("p0", "a crawler reported an error")]


@pytest.mark.parametrize("server", [{"proxies": 3}], indirect=True)
def test_selector_and_listing(server: ServerThread, http: httpx.Client) -> None:
    assert server.fake is not None
    server.call(lambda: server.fake.set("p2", Health.UNHEALTHY, "refused: 127.0.0.1:4002"))  # type: ignore[union-attr]
    listing = http.get("/v1/proxies")
    assert listing.status_code == 200
    proxies = listing.json()["proxies"]
    assert [p["name"] for p in proxies] == ["p0", "p1", "p2"]
    for proxy in proxies:
        assert list(proxy) == [
            "name",
            "provider",
            "type",
            "zone",
            "labels",
            "health",
            "latencyMs",
            "lastError",
            "leased",
            "cooldowns",
        ]
    assert proxies[2]["health"] == "unhealthy" and proxies[2]["lastError"].startswith("refused")
    assert PASSWORD not in listing.text and "crawler" not in listing.text
    no_match = http.post("/v1/leases", json={"holder": "c", "selector": {"provider": "other"}})
    assert_error(no_match, 409)
    assert http.post(
        "/v1/leases", json={"holder": "c", "selector": {"provider": "corp", "labels": {}}}
    ).json()["proxy"]["name"] in ("p0", "p1")


# -- exclusivity ----------------------------------------------------------------------------


@pytest.mark.parametrize("server", [{"proxies": 50}], indirect=True)
def test_200_concurrent_grants_on_50_proxies(server: ServerThread) -> None:
    async def storm() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30) as client:
            return await asyncio.gather(
                *(client.post("/v1/leases", json={"holder": f"c{i}"}) for i in range(200))
            )

    answers = asyncio.run(storm())
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(201) == 50 and statuses.count(409) == 150, statuses
    names = [a.json()["proxy"]["name"] for a in answers if a.status_code == 201]
    assert len(set(names)) == 50
    with sqlite3.connect(sqlite_path(server)) as db:
        assert db.execute("SELECT count(DISTINCT proxy), count(*) FROM leases").fetchone() == (
            50,
            50,
        )


# -- bad input ------------------------------------------------------------------------------

BAD_GRANTS: list[tuple[Any, int]] = [
    ({"holder": 5}, 400),
    ({}, 400),
    ({"holder": ""}, 400),
    ({"holder": "c", "ttlSeconds": -1}, 400),
    ({"holder": "c", "ttlSeconds": 0}, 400),
    ({"holder": "c", "ttlSeconds": 1e-9}, 400),  # already expired when granted
    ({"holder": "c", "ttlSeconds": 0.999}, 400),
    ({"holder": "c", "ttlSeconds": "10"}, 400),
    ({"holder": "c", "ttlSeconds": True}, 400),
    ({"holder": "c", "ttl": 10}, 400),
    ({"holder": "c", "selector": {"labels": {"a": 1}}}, 400),
    ({"holder": "c", "selector": "corp"}, 400),
    ({"holder": "c", "target": "not a host"}, 400),
    ({"holder": "c", "target": 7}, 400),
    ([], 400),
    ("holder", 400),
]


def test_bad_input_is_refused_and_changes_nothing(server: ServerThread, http: httpx.Client) -> None:
    lease_id = http.post("/v1/leases", json={"holder": "c", "ttlSeconds": 30}).json()["id"]
    before = (http.get("/v1/proxies").json(), store_state(server))
    for body, status in BAD_GRANTS:
        assert_error(http.post("/v1/leases", json=body), status, "bad_request")
    assert_error(
        http.post("/v1/leases", content=b"{not json", headers={"content-type": "application/json"}),
        400,
    )
    assert_error(http.post("/v1/leases"), 400)
    assert_error(http.post(f"/v1/leases/{lease_id}/renew", json={"ttlSeconds": -5}), 400)
    assert_error(http.post(f"/v1/leases/{lease_id}/renew", json={"ttlSeconds": 1e-300}), 400)
    assert_error(http.post(f"/v1/leases/{lease_id}/renew", json={"ttlSeconds": "5"}), 400)
    assert_error(http.post(f"/v1/leases/{lease_id}/report", json={"outcome": "great"}), 400)
    assert_error(http.post(f"/v1/leases/{lease_id}/report", json={}), 400)
    assert_error(
        http.post(f"/v1/leases/{lease_id}/report", json={"outcome": "blocked", "target": "a b"}),
        400,
    )
    for answer in (
        http.post("/v1/leases/no-such-lease/renew"),
        http.post("/v1/leases/no-such-lease/report", json={"outcome": "ok"}),
        http.delete("/v1/leases/no-such-lease"),
    ):
        assert_error(answer, 404, "lease_not_found")
    huge = b'{"holder": "' + b"x" * 200_000 + b'"}'
    assert_error(http.post("/v1/leases", content=huge), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as it streams
        yield b'{"holder": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}'

    assert_error(http.post("/v1/leases", content=chunks()), 413)
    assert_error(http.get("/no/such/path"), 404, "not_found")
    assert_error(http.put("/v1/leases"), 405, "method_not_allowed")
    assert (http.get("/v1/proxies").json(), store_state(server)) == before


BAD_TARGETS = [
    ("[:::::]", "not an IPv6 address"),
    ("shop.example:0", "port"),
    ("https://shop.example:99999/", "port"),
    ("a" * 2000, "longer than 253"),
    ("1.2.3.999", "not an IPv4 address"),
]


def test_bad_targets_get_400_naming_the_problem(server: ServerThread, http: httpx.Client) -> None:
    lease_id = http.post("/v1/leases", json={"holder": "c", "ttlSeconds": 30}).json()["id"]
    before = (http.get("/v1/proxies").json(), store_state(server))
    for target, reason in BAD_TARGETS:
        for answer in (
            http.post("/v1/leases", json={"holder": "c", "target": target}),
            http.post(
                f"/v1/leases/{lease_id}/report", json={"outcome": "blocked", "target": target}
            ),
        ):
            assert_error(answer, 400, "bad_request")
            detail = answer.json()["detail"]
            assert detail.startswith("target: ") and reason in detail, detail
            assert len(detail) < 120 and "(?:" not in detail and target not in detail, detail
    assert (http.get("/v1/proxies").json(), store_state(server)) == before
    assert http.delete(f"/v1/leases/{lease_id}").status_code == 204
    for target in (
        "shop.example",
        "SHOP.example:8443",
        "http://u:p@10.1.2.3:80/x?y",
        "[2001:db8::7]",
    ):
        granted = http.post("/v1/leases", json={"holder": "c", "target": target})
        assert granted.status_code == 201, granted.text
        reported = http.post(
            f"/v1/leases/{granted.json()['id']}/report", json={"outcome": "ok", "target": target}
        )
        assert reported.status_code == 204, reported.text
        assert http.delete(f"/v1/leases/{granted.json()['id']}").status_code == 204


# -- auth -----------------------------------------------------------------------------------

TOKEN = "tok-" + "a1b2c3" * 6


@pytest.mark.parametrize("server", [{"token": TOKEN}], indirect=True)
def test_bearer_token_on_v1_only(server: ServerThread, http: httpx.Client) -> None:
    good = {"Authorization": f"Bearer {TOKEN}"}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ):
        for answer in (
            http.post("/v1/leases", json={"holder": "c"}, headers=headers),
            http.get("/v1/proxies", headers=headers),
            http.delete("/v1/leases/x", headers=headers),
        ):
            assert_error(answer, 401, "unauthorized")
            assert answer.headers["www-authenticate"].startswith("Bearer")
        # A right token clears the count of wrong ones (the brake: below).
        assert http.get("/v1/proxies", headers=good).status_code == 200
    assert store_state(server)[0] == []
    assert http.post("/v1/leases", json={"holder": "c"}, headers=good).status_code == 201
    assert http.get("/v1/proxies", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200
    for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert http.get(open_path).status_code == 200, open_path


@pytest.mark.parametrize("server", [{"token": TOKEN}], indirect=True)
def test_wrong_tokens_are_braked_over_a_real_socket(
    server: ServerThread, http: httpx.Client
) -> None:
    wrong = {"Authorization": "Bearer " + "w" * 40}
    statuses = [http.get("/v1/proxies", headers=wrong).status_code for _ in range(5)]
    assert statuses == [401] * 5
    braked = http.post("/v1/leases", json={"holder": "c"}, headers=wrong)
    assert_error(braked, 429, "too_many_requests")
    assert int(braked.headers["retry-after"]) >= 1
    assert "127.0.0.1" in braked.json()["detail"]
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert http.get("/v1/proxies", headers=good).status_code == 429  # not even compared
    assert http.get("/healthz").status_code == 200  # what needs no token is served
    spec = http.get("/openapi.json").json()
    assert "429" in spec["paths"]["/v1/leases"]["post"]["responses"]


# -- service endpoints ----------------------------------------------------------------------


def test_health_readiness_metrics_and_openapi(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ready"}
    lease_id = http.post("/v1/leases", json={"holder": "c"}).json()["id"]
    http.post("/v1/leases", json={"holder": "d"})
    http.post(f"/v1/leases/{lease_id}/report", json={"outcome": "blocked"})
    http.delete(f"/v1/leases/{lease_id}")
    metrics = http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for line in (
        "discovery_leases_active 0.0",
        "discovery_leases_granted_total 1.0",
        'discovery_lease_denials_total{reason="leased"} 1.0',
        "discovery_leases_released_total 1.0",
        "discovery_leases_expired_total 0.0",
        "discovery_cooldowns_active 1.0",
        'discovery_proxies{health="healthy"} 1.0',
        'discovery_reports_total{outcome="blocked"} 1.0',
        'discovery_request_duration_seconds_count{method="POST",route="/v1/leases",status="201"} 1.0',
    ):
        assert line in metrics.text, line
    assert PASSWORD not in metrics.text
    spec = http.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert {
        "/v1/leases",
        "/v1/leases/{lease_id}/renew",
        "/v1/leases/{lease_id}/report",
        "/v1/leases/{lease_id}",
        "/v1/proxies",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])
    grant = spec["paths"]["/v1/leases"]["post"]
    assert {"201", "400", "409"} <= set(grant["responses"])


# -- the Python client ----------------------------------------------------------------------


@pytest.mark.parametrize("server", [{"max_lease_ttl": 0.9}], indirect=True)
def test_client_renews_in_the_background_reports_and_releases(
    server: ServerThread, http: httpx.Client
) -> None:
    with lease(server.url, "crawler-1", target="https://example.com/x", ttl=1.5) as proxy:
        assert proxy.name == "p0" and proxy.url.startswith("http://crawler:")
        assert PASSWORD not in repr(proxy)
        time.sleep(3.5)  # more than twice the TTL: only renewals keep it
        assert not proxy.lost
        assert http.get("/v1/proxies").json()["proxies"][0]["leased"] is True
        proxy.report("blocked")  # the lease's target by default
    [listed] = http.get("/v1/proxies").json()["proxies"]
    assert listed["leased"] is False
    assert [c["target"] for c in listed["cooldowns"]] == ["example.com"]


def test_client_waits_on_409_honouring_retry_after(
    server: ServerThread, http: httpx.Client
) -> None:
    http.post("/v1/leases", json={"holder": "other", "ttlSeconds": 1})
    start = time.monotonic()
    with lease(server.url, "patient") as proxy:
        waited = time.monotonic() - start
        assert proxy.name == "p0"
    assert 0.9 <= waited < 3, waited
    http.post("/v1/leases", json={"holder": "other", "ttlSeconds": 30})
    with pytest.raises(NoProxyAvailable) as caught, lease(server.url, "impatient", wait=0.5):
        pass
    assert caught.value.retry_after >= 29


def test_client_releases_when_the_block_raises(server: ServerThread, http: httpx.Client) -> None:
    with pytest.raises(RuntimeError, match="crawl failed"), lease(server.url, "c"):
        raise RuntimeError("crawl failed")
    assert http.get("/v1/proxies").json()["proxies"][0]["leased"] is False


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_one_service_answers_alike_on_either_store(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    """Input no store could keep (NUL: PostgreSQL refused it with a 500) is a
    400 before any store sees it; a lease id no grant made is a 404; the
    gauges are read at each scrape (PostgreSQL's lagged a second)."""
    db: Any = tmp_path / "leases.db"
    if store == "postgres":
        server: Any = request.getfixturevalue("postgres")
        db = PostgresUrl(server.fresh_database(f"api_{random.randrange(1 << 30)}"))
    settings = settings_for(tmp_path, db=db)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("p0", zone="z1", labels={"k": "v"})])
    with ServerThread(settings) as running, httpx.Client(base_url=running.url, timeout=10) as http:
        wait_for(lambda: http.get("/v1/proxies").json()["proxies"][0]["health"] == "healthy")
        for body in (
            {"holder": "h\u0000x"},
            {"holder": "h", "selector": {"provider": "c\u0000"}},
            {"holder": "h", "selector": {"zone": "z\u0000"}},
            {"holder": "h", "selector": {"labels": {"k\u0000": "v"}}},
            {"holder": "h", "selector": {"labels": {"k": "v\u0000"}}},
        ):
            assert_error(http.post("/v1/leases", json=body), 400, "bad_request")
        for path in ("/v1/leases/%00/renew", "/v1/leases/%00/report"):
            assert_error(http.post(path, json={"outcome": "ok"} if "report" in path else {}), 404)
        assert_error(http.delete("/v1/leases/%00"), 404)
        lease = http.post("/v1/leases", json={"holder": "h", "selector": {"zone": "z1"}})
        assert lease.status_code == 201, lease.text
        assert "discovery_leases_active 1.0" in http.get("/metrics").text
        assert http.delete(f"/v1/leases/{lease.json()['id']}").status_code == 204
        assert "discovery_leases_active 0.0" in http.get("/metrics").text
