"""The gateway (docs/gateway.md) through the real service, real squids and a
site that sees which address each request came from: sessions, site sets,
bans, idle release, the report endpoint, and the faults each with the status
and reason it promises, no lease left held and no descriptor left open.

Clients of every kind (curl, requests, httpx, Scrapy, Chromium) are in
test_gateway_clients.py; this file speaks HTTP with httpx and raw sockets.
"""

from __future__ import annotations

import base64
import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.crawlsite import (
    TOKEN,
    BanningSite,
    Proxy,
    assert_no_proxy_blamed,
    client,
    crawl_service,
    start_proxies,
)
from tests.support.deadsites import SilentSite, UnreachableSite
from tests.support.discovery import ServiceProcess, free_port, proxies
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.squid import EchoServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def squids() -> Iterator[list[Proxy]]:
    with start_proxies(3) as running:
        yield running


@pytest.fixture
def site() -> Iterator[BanningSite]:
    with BanningSite(limit=1000) as running:
        yield running


class Gateway:
    def __init__(self, service: ServiceProcess, port: int) -> None:
        self.service = service
        self.port = port

    def url(self, user: str = "crawler7", token: str = TOKEN) -> str:
        return f"http://{user}:{token}@127.0.0.1:{self.port}"

    def http(self, user: str = "crawler7") -> httpx.Client:
        return httpx.Client(proxy=self.url(user), timeout=20)

    def raw(self, data: bytes) -> bytes:
        """Sends `data`, returns everything the gateway answers until it closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(data)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    def holders(self) -> dict[str, str | None]:
        """Proxy name -> the holder of its lease (the status page's data)."""
        with client(self.service) as http:
            rows = http.get("/ui/api/status", params={"limit": 500}).json()["proxies"]
        return {r["name"]: (r["lease"] or {}).get("holder") for r in rows}

    def fds(self) -> int:
        assert self.service.process is not None
        return len(os.listdir(f"/proc/{self.service.process.pid}/fd"))


@contextmanager
def start_gateway(
    tmp_path: Path, squids: list[Proxy], *extra: str, cooldown: int = 600
) -> Iterator[Gateway]:
    port = free_port()
    args = ["--gateway", f"127.0.0.1:{port}", "--gateway-idle", "1", *extra]
    with crawl_service(tmp_path, squids, extra=args, cooldown=cooldown) as service:
        yield Gateway(service, port)


@pytest.fixture
def gateway(tmp_path: Path, squids: list[Proxy]) -> Iterator[Gateway]:
    with start_gateway(tmp_path, squids) as running:
        yield running


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {check}")
        time.sleep(0.1)


def nothing_leased(gateway: Gateway) -> bool:
    with client(gateway.service) as http:
        return not any(p["leased"] for p in proxies(http).values())


def address_of(answer: httpx.Response) -> str:
    """The proxy address the site saw (`page N for ADDRESS`)."""
    return answer.text.split(" for ")[1].strip()


# -- sessions and site sets -----------------------------------------------------------------


def test_a_session_leaves_through_one_proxy_and_two_sessions_hold_two(
    gateway: Gateway, site: BanningSite
) -> None:
    seen: dict[str, set[str]] = {}
    for session in ("a", "b"):
        with gateway.http(f"crawler7-session-{session}") as http:
            answers = [http.get(f"{site.base}/page/{i}") for i in range(4)]
        assert all(a.status_code == 200 for a in answers)
        seen[session] = {address_of(a) for a in answers}
    assert len(seen["a"]) == 1 and len(seen["b"]) == 1
    assert seen["a"] != seen["b"]
    assert site.direct == 0
    held = {h for h in gateway.holders().values() if h}
    assert held == {"crawler7-session-a", "crawler7-session-b"}


def test_an_idle_session_gives_its_lease_back(gateway: Gateway, site: BanningSite) -> None:
    with gateway.http("crawler7-session-idle") as http:
        assert http.get(f"{site.base}/page/1").status_code == 200
    assert "crawler7-session-idle" in gateway.holders().values()
    eventually(lambda: nothing_leased(gateway), timeout=5)  # --gateway-idle 1
    with client(gateway.service) as http:  # every proxy grantable through the API again
        for _ in range(3):
            assert http.post("/v1/leases", json={"holder": "api"}).status_code == 201


def test_a_banned_proxy_moves_the_site_to_another_and_cools_down_for_that_site_only(
    tmp_path: Path, squids: list[Proxy]
) -> None:
    with BanningSite(limit=2) as site, start_gateway(tmp_path, squids) as gateway:
        with gateway.http() as http:
            answers = [http.get(f"{site.base}/page/{i}") for i in range(5)]
        # Every answer a page: each 403 was reported and retried through another proxy.
        assert [a.status_code for a in answers] == [200] * 5
        banned = site.banned()
        assert banned and site.after_ban.keys() <= banned
        with client(gateway.service) as api:
            listed = proxies(api)
            cooling = {n for n, p in listed.items() if p["cooldowns"]}
            assert {c["target"] for n in cooling for c in listed[n]["cooldowns"]} == {"127.0.0.1"}
            by_address = {p.address: p.name for p in squids}
            assert cooling == {by_address[a] for a in banned}
            # Another site still gets the cooling proxy: every proxy is grantable for it.
            eventually(lambda: nothing_leased(gateway), timeout=5)
            granted = {
                api.post("/v1/leases", json={"holder": "x", "target": "localhost"}).json()["proxy"][
                    "name"
                ]
                for _ in range(3)
            }
            assert cooling <= granted


def test_a_session_moves_when_its_proxy_is_banned(tmp_path: Path, squids: list[Proxy]) -> None:
    with BanningSite(limit=2) as site, start_gateway(tmp_path, squids) as gateway:
        with gateway.http("crawler7-session-s") as http:
            answers = [http.get(f"{site.base}/page/{i}") for i in range(4)]
        assert [a.status_code for a in answers] == [200] * 4
        first, second = address_of(answers[0]), address_of(answers[3])
        assert first != second
        assert {address_of(a) for a in answers[:2]} == {first}
        assert {address_of(a) for a in answers[2:]} == {second}


def test_a_tunnel_s_ban_is_reported_through_the_api_and_moves_the_session(
    gateway: Gateway,
) -> None:
    echo = EchoServer()
    try:
        target = f"127.0.0.1:{echo.port}".encode()
        user = "crawler7-session-t"

        def tunnel_proxy() -> str:
            with tunnel(gateway, target, user) as sock:
                sock.sendall(b"ping")
                assert sock.recv(4) == b"ping"
                return next(n for n, h in gateway.holders().items() if h == user)

        before = tunnel_proxy()
        with client(gateway.service) as api:
            body = {
                "holder": "crawler7",
                "session": "t",
                "outcome": "blocked",
                "target": "127.0.0.1",
            }
            assert api.post("/v1/gateway/report", json=body).status_code == 204
            assert proxies(api)[before]["cooldowns"][0]["target"] == "127.0.0.1"
            unknown = api.post("/v1/gateway/report", json={**body, "session": "nobody"})
            assert unknown.status_code == 404
            assert unknown.json()["error"] == "session_not_found"
        # The reported proxy is given back once its tunnel has closed.
        eventually(lambda: gateway.holders()[before] != user, timeout=5)
        assert tunnel_proxy() != before
    finally:
        echo.close()


# -- refusals and faults ----------------------------------------------------------------------


def auth(user: str, token: str) -> bytes:
    return base64.b64encode(f"{user}:{token}".encode())


def status_and_reason(answer: bytes) -> tuple[int, str]:
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    status = int(head.split(" ", 2)[1])
    reasons = [
        line.split(":", 1)[1].strip()
        for line in head.split("\r\n")
        if line.lower().startswith("egress-gateway-reason:")
    ]
    return status, reasons[0] if reasons else ""


def test_refusals_have_their_status_and_reason_and_hold_nothing(
    gateway: Gateway, site: BanningSite
) -> None:
    url = f"{site.base}/page/1".encode()
    get = b"GET %s HTTP/1.1\r\nHost: x\r\n" % url
    cases = {
        "no credentials": (get + b"\r\n", 407, "auth_required"),
        "wrong token": (
            get
            + b"Proxy-Authorization: Basic "
            + auth("c", "wrong-token-0123456789")
            + b"\r\n\r\n",
            407,
            "wrong_token",
        ),
        "not basic": (
            get + b"Proxy-Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n",
            407,
            "auth_required",
        ),
        "bad username": (
            get + b"Proxy-Authorization: Basic " + auth("c-session-a b", TOKEN) + b"\r\n\r\n",
            400,
            "bad_username",
        ),
        "malformed request line": (b"GET\r\n\r\n", 400, "bad_request"),
        "https in absolute form": (
            b"GET https://x/ HTTP/1.1\r\nProxy-Authorization: Basic "
            + auth("c", TOKEN)
            + b"\r\n\r\n",
            400,
            "bad_target",
        ),
        "bad CONNECT target": (
            b"CONNECT nohost HTTP/1.1\r\nProxy-Authorization: Basic "
            + auth("c", TOKEN)
            + b"\r\n\r\n",
            400,
            "bad_target",
        ),
        "oversize headers": (get + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "head_too_large"),
    }
    for name, (request, status, reason) in cases.items():
        answer = gateway.raw(request)
        assert status_and_reason(answer) == (status, reason), name
        if status == 407:
            assert b"proxy-authenticate: Basic" in answer, name
        assert TOKEN.encode() not in answer, name
    assert site.served == {} and site.direct == 0
    assert nothing_leased(gateway)


def test_a_client_that_vanishes_leaves_no_lease_and_no_descriptor(
    gateway: Gateway, site: BanningSite
) -> None:
    with gateway.http() as http:  # warm: the descriptors a first request opens for good
        assert http.get(f"{site.base}/page/1").status_code == 200
    eventually(lambda: nothing_leased(gateway), timeout=5)
    baseline = gateway.fds()
    credentials = b"Proxy-Authorization: Basic " + auth("c", TOKEN) + b"\r\n"
    for request in (
        # half a body, then gone
        b"POST %s/page/2 HTTP/1.1\r\nContent-Length: 1000\r\n%s\r\n0123456789"
        % (site.base.encode(), credentials),
        # half a head, then gone
        b"GET %s/page/3 HTTP/1.1\r\nHost: x\r\n" % site.base.encode(),
    ):
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(request)
            time.sleep(0.2)
    # a tunnel opened, then the client gone
    echo = EchoServer()
    try:
        with tunnel(gateway, f"127.0.0.1:{echo.port}".encode(), "c") as sock:
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
    finally:
        echo.close()
    eventually(lambda: nothing_leased(gateway), timeout=5)
    eventually(lambda: gateway.fds() <= baseline, timeout=5)


def test_a_squid_killed_under_an_open_tunnel_closes_it_and_the_next_tries_another(
    tmp_path: Path,
) -> None:
    with (
        start_proxies(2) as running,
        BanningSite(limit=100) as site,
        start_gateway(tmp_path, running) as gateway,
    ):
        echo = EchoServer()
        try:
            with tunnel(gateway, f"127.0.0.1:{echo.port}".encode(), "c-session-k") as sock:
                sock.sendall(b"x")
                assert sock.recv(1) == b"x"
                name = next(n for n, h in gateway.holders().items() if h == "c-session-k")
                dead = next(p for p in running if p.name == name)
                dead.squid.stop()
                sock.settimeout(10)
                assert sock.recv(1) == b""  # the tunnel closed with its squid
        finally:
            echo.close()
        # The session's squid is dead and not yet unhealthy: reported, tried again elsewhere.
        with gateway.http("c-session-k") as http:
            answer = http.get(f"{site.base}/page/1")
        assert answer.status_code == 200
        assert address_of(answer) != dead.address
        metrics = httpx.get(gateway.service.url + "/metrics").text
        assert 'discovery_gateway_upstream_errors_total{kind="refused"}' in metrics


def test_a_site_that_does_not_answer_is_a_504_and_blames_no_proxy(
    tmp_path: Path, squids: list[Proxy]
) -> None:
    """A hung server and a host that drops connections: the squid waits on the
    site, so the proxy is not reported (two reports in a row would make it
    unhealthy: a crawler on a few dead links would take the fleet down)."""
    with (
        SilentSite() as silent,
        UnreachableSite() as unreachable,
        BanningSite(limit=100) as site,
        start_gateway(tmp_path, squids, "--gateway-answer-timeout", "1") as gateway,
    ):
        with gateway.http("c-session-dead") as http:
            for _ in range(3):
                answer = http.get(silent.url)
                assert answer.status_code == 504
                assert answer.headers["egress-gateway-reason"] == "upstream_timeout"
                assert "no answer through the proxy within 1 s" in answer.text
        target = unreachable.authority.encode()
        connect = b"CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n"
        for _ in range(3):
            refused = gateway.raw(connect % (target, target, auth("crawler7", TOKEN)))
            assert status_and_reason(refused) == (504, "upstream_timeout")
        metrics = httpx.get(gateway.service.url + "/metrics").text
        assert 'discovery_gateway_upstream_errors_total{kind="no_answer"} 6.0' in metrics
        assert_no_proxy_blamed(gateway.service)
        with gateway.http("c-session-dead") as http:
            assert http.get(f"{site.base}/page/1").status_code == 200


def test_no_healthy_proxy_and_an_empty_fleet_are_a_503_with_retry_after(tmp_path: Path) -> None:
    with (
        start_proxies(1) as running,
        BanningSite(limit=100) as site,
        start_gateway(tmp_path, running) as gateway,
    ):
        running[0].squid.stop()
        with client(gateway.service) as api:
            eventually(lambda: proxies(api)["sq0"]["health"] == "unhealthy")
        with gateway.http() as http:
            answer = http.get(f"{site.base}/page/1")
        assert answer.status_code == 503
        assert answer.headers["egress-gateway-reason"] == "no_healthy_proxy"
        assert int(answer.headers["retry-after"]) >= 1
        assert "not healthy" in answer.text
    empty = tmp_path / "empty"
    empty.mkdir()
    with start_gateway(empty, []) as gateway:
        with gateway.http() as http:
            answer = http.get("http://127.0.0.1:9/")
        assert answer.status_code == 503
        assert answer.headers["egress-gateway-reason"] == "no_proxy_matches"
        assert int(answer.headers["retry-after"]) >= 1


def test_metrics_count_requests_tunnels_and_bytes(gateway: Gateway, site: BanningSite) -> None:
    with gateway.http() as http:
        assert http.get(f"{site.base}/page/1").status_code == 200
    gateway.raw(b"GET http://x/ HTTP/1.1\r\n\r\n")  # refused: no credentials
    metrics = httpx.get(gateway.service.url + "/metrics").text
    assert 'discovery_gateway_requests_total{outcome="ok"} 1.0' in metrics
    assert 'discovery_gateway_requests_total{outcome="refused"} 1.0' in metrics
    assert 'discovery_gateway_holder_bytes_total{direction="down",holder="crawler7"}' in metrics
    assert "discovery_gateway_first_byte_seconds_count 1.0" in metrics
    assert "discovery_gateway_tunnels_open 0.0" in metrics
    with client(gateway.service) as api:
        rows = api.get("/ui/api/status").json()["proxies"]
    used = [r for r in rows if r["gateway"]]
    assert len(used) == 1 and used[0]["gateway"]["bytesDown"] > 0


# -- helpers ----------------------------------------------------------------------------------


class tunnel:
    """A CONNECT tunnel through the gateway, as a connected socket."""

    def __init__(self, gateway: Gateway, target: bytes, user: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        self.sock.sendall(
            b"CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n"
            % (target, target, auth(user, TOKEN))
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head

    def __enter__(self) -> socket.socket:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_gateways_on_two_postgresql_replicas_never_share_a_proxy(
    tmp_path: Path, squids: list[Proxy], postgres: PostgresServer
) -> None:
    database = postgres.fresh_database(f"gateway_{random.randrange(1 << 30)}")
    echo = EchoServer()
    target = f"127.0.0.1:{echo.port}".encode()
    with ExitStack() as stack:
        gateways = []
        for replica in ("a", "b"):
            (tmp_path / replica).mkdir()
            port = free_port()
            service = stack.enter_context(
                crawl_service(
                    tmp_path / replica,
                    squids,
                    extra=["--gateway", f"127.0.0.1:{port}"],
                    db=database,
                )
            )
            gateways.append(Gateway(service, port))
        stack.callback(echo.close)
        # Three proxies, sessions on both replicas: each on a proxy of its own.
        users = ["c-session-a1", "c-session-b1", "c-session-a2"]
        for user, gateway in zip(users, [gateways[0], gateways[1], gateways[0]], strict=True):
            sock = stack.enter_context(tunnel(gateway, target, user))
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
        held = gateways[1].holders()  # the shared database: every replica sees every lease
        assert sorted(h for h in held.values() if h) == sorted(users)
        # The fleet is taken: a fourth session on either replica gets a 503, not a shared proxy.
        for gateway in gateways:
            with gateway.http("c-session-x") as http:
                answer = http.get(f"http://127.0.0.1:{echo.port}/")
            assert answer.status_code == 503
            assert answer.headers["egress-gateway-reason"] == "all_leased"


def test_tunnel_caps_idle_tunnels_and_slow_heads_are_closed(
    tmp_path: Path, squids: list[Proxy]
) -> None:
    """--gateway-max-tunnels and --gateway-holder-tunnels refuse with their
    reasons, a tunnel idle past --gateway-tunnel-idle is closed, and a head
    that does not arrive whole in time is a 408."""
    echo = EchoServer()
    target = f"127.0.0.1:{echo.port}".encode()
    caps = ["--gateway-max-tunnels", "2", "--gateway-holder-tunnels", "1"]
    with ExitStack() as stack:
        stack.callback(echo.close)
        gateway = stack.enter_context(
            start_gateway(tmp_path, squids, *caps, "--gateway-tunnel-idle", "2")
        )
        first = stack.enter_context(tunnel(gateway, target, "one"))
        connect = b"CONNECT %s HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n"
        answer = gateway.raw(connect % (target, auth("one", TOKEN)))
        assert status_and_reason(answer) == (503, "holder_tunnel_limit")
        second = stack.enter_context(tunnel(gateway, target, "two"))
        answer = gateway.raw(connect % (target, auth("three", TOKEN)))
        assert status_and_reason(answer) == (503, "tunnel_limit")
        assert b"retry-after: 1" in answer
        # Idle tunnels: closed by the gateway (the upkeep looks every second).
        for sock in (first, second):
            sock.settimeout(10)
            started = time.monotonic()
            assert sock.recv(1) == b""
            assert time.monotonic() - started < 8
        # A head that never completes: 408 after the API's request timeout.
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as slow:
            slow.sendall(b"GET http://x/ HTTP/1.1\r\n")
            chunks = []
            while chunk := slow.recv(65536):
                chunks.append(chunk)
        assert status_and_reason(b"".join(chunks)) == (408, "request_timeout")


def test_plain_requests_keep_the_client_connection_alive(
    gateway: Gateway, site: BanningSite
) -> None:
    credentials = b"Proxy-Authorization: Basic " + auth("c", TOKEN)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        reader = sock.makefile("rb")
        for page in (1, 2, 3):  # one after another on the same connection
            sock.sendall(
                b"GET %s/page/%d HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n"
                % (site.base.encode(), page, credentials)
            )
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                assert name.strip().lower() != b"connection" or b"keep-alive" in value
            assert reader.read(length).startswith(b"page %d for 127.0.0." % page)
