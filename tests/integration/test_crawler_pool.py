"""The lease pool under the crawler adapters (discovery.rotation.LeasePool) and
the httpx transport's proxy failures, against the real app on a loopback
socket with health verdicts from a fake: leases per site, bans and cooldowns
per site, waiting on Retry-After, renewal, idle and lost leases, release on
close. The real crawls through squids are in test_crawlers.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.client import NoProxyAvailable, lease
from discovery.httpx import DiscoveryTransport
from discovery.rotation import Held, LeasePool, PoolClosed
from tests.support.discovery import (
    ServerThread,
    free_port,
    proxies,
    proxy_entry,
    settings_for,
    wait_for,
    write_fleet,
)

PASSWORD = "pw-of-the-pool"


def start_server(tmp_path: Path, ports: list[int], **options: Any) -> ServerThread:
    values: dict[str, Any] = {"max_lease_ttl": 60, "lease_cooldown": 30}
    values.update(options)
    settings = settings_for(tmp_path, **values)
    assert settings.fleet_file is not None
    write_fleet(
        settings.fleet_file,
        [
            proxy_entry(f"p{i}", port=port, username="crawler", password=PASSWORD)
            for i, port in enumerate(ports)
        ],
    )
    return ServerThread(settings).start()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    running = start_server(tmp_path, [4100, 4101, 4102])
    yield running
    running.stop()


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def pool(server: ServerThread, counts: Counter[str] | None = None, **options: Any) -> LeasePool:
    def count(key: str, n: int) -> None:
        if counts is not None:
            counts[key] += n

    return LeasePool(server.url, holder="pool-test", token="", count=count, **options)


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def leased(http: httpx.Client) -> set[str]:
    return {name for name, p in proxies(http).items() if p["leased"]}


def test_a_site_holds_its_leases_and_spreads_requests_over_them(
    server: ServerThread, http: httpx.Client
) -> None:
    counts: Counter[str] = Counter()

    async def run() -> None:
        leases = pool(server, counts, per_site=2, wait=0)
        try:
            used = [await leases.acquire("a.example") for _ in range(4)]
            assert len({h.id for h in used}) == 2
            assert [h.name for h in used[:2]] == [h.name for h in used[2:]]  # in turn
            other = await leases.acquire("b.example")
            assert other.name not in {h.name for h in used}
            assert leased(http) == {"p0", "p1", "p2"}
            # The fleet is taken: c.example gets nothing, at once (wait=0).
            with pytest.raises(
                NoProxyAvailable, match=r"no proxy for c\.example after waiting 0 s"
            ):
                await leases.acquire("c.example")
        finally:
            await leases.aclose()

    asyncio.run(run())
    assert leased(http) == set()
    assert counts == {
        "leases/granted": 3,
        "leases/released": 3,
        "leases/denied": 1,
        "no_proxy": 1,
    }


def test_a_ban_rests_the_proxy_for_that_site_only(server: ServerThread, http: httpx.Client) -> None:
    async def run() -> None:
        leases = pool(server, wait=0)
        try:
            first = await leases.acquire("shop.example")
            assert await leases.blocked(first)
            assert not await leases.blocked(first)  # a second ban of it (in flight): nothing more
            assert leases.lookup(first.id) is None
            again = await leases.acquire("shop.example")
            assert again.name != first.name
            # Another site may have the banned proxy.
            names = {(await leases.acquire(site)).name for site in ("x.example", "y.example")}
            assert first.name in names
        finally:
            await leases.aclose()

    asyncio.run(run())
    cooling = {n: [c["target"] for c in p["cooldowns"]] for n, p in proxies(http).items()}
    assert sorted(cooling.values()) == [[], [], ["shop.example"]]


def test_waits_what_retry_after_says_then_gets_the_proxy(tmp_path: Path) -> None:
    server = start_server(tmp_path, [4100])
    try:
        # Another crawler holds the only proxy for 1.5 s, without renewing.
        with lease(server.url, holder="other", ttl=1.5, renew=False):
            counts: Counter[str] = Counter()

            async def run() -> tuple[Held, float]:
                leases = pool(server, counts, wait=10)
                started = time.monotonic()
                try:
                    held = await leases.acquire("shop.example")
                    return held, time.monotonic() - started
                finally:
                    await leases.aclose()

            held, waited = asyncio.run(run())
    finally:
        server.stop()
    assert held.name == "p0"
    assert 1.0 < waited < 4.0  # Retry-After: 2 (the other lease's expiry, rounded up)
    assert counts["leases/denied"] == 1


def test_renews_a_lease_in_use_past_its_ttl(server: ServerThread, http: httpx.Client) -> None:
    async def run() -> None:
        leases = pool(server, ttl=1.2, idle=None)
        try:
            held = await leases.acquire("shop.example")
            first_expiry = held.expires_at
            await asyncio.sleep(3.0)
            assert leases.lookup(held.id) is held
            assert held.expires_at > first_expiry + 1
            renewed = http.post(f"/v1/leases/{held.id}/renew")
            assert renewed.status_code == 200  # still the service's, after 2.5 TTLs
        finally:
            await leases.aclose()

    asyncio.run(run())


def test_gives_back_a_lease_nobody_used_for_idle_seconds(
    server: ServerThread, http: httpx.Client
) -> None:
    counts: Counter[str] = Counter()

    async def run() -> None:
        leases = pool(server, counts, idle=0.4)
        try:
            held = await leases.acquire("shop.example")
            busy = await leases.acquire("busy.example")  # in use (never done) the whole time
            leases.done(held)
            await eventually(lambda: counts["leases/released"] == 1)  # given back, answered
            assert leases.lookup(held.id) is None
            assert leases.lookup(busy.id) is busy
            assert leased(http) == {busy.name}
        finally:
            await leases.aclose()

    asyncio.run(run())
    assert counts["leases/idle"] == 1
    assert counts["leases/released"] == 2


def test_a_lease_the_service_ended_is_dropped_and_replaced(
    server: ServerThread, http: httpx.Client
) -> None:
    counts: Counter[str] = Counter()

    async def run() -> None:
        leases = pool(server, counts, ttl=1.0)  # the service's minimum
        try:
            held = await leases.acquire("shop.example")
            assert http.delete(f"/v1/leases/{held.id}").status_code == 204  # behind its back
            # The next renewal (at a third of 1 s) hears 404.
            await eventually(lambda: leases.lookup(held.id) is None)
            replacement = await leases.acquire("shop.example")
            assert replacement.id != held.id
        finally:
            await leases.aclose()

    asyncio.run(run())
    assert counts["leases/lost"] == 1


def test_close_releases_every_lease_and_ends_the_pool(
    server: ServerThread, http: httpx.Client
) -> None:
    async def run() -> None:
        leases = pool(server)
        for site in ("a.example", "b.example", "c.example"):
            await leases.acquire(site)
        assert leased(http) == {"p0", "p1", "p2"}
        await leases.aclose()
        await leases.aclose()  # again: nothing
        assert leased(http) == set()
        with pytest.raises(PoolClosed):
            await leases.acquire("a.example")

    asyncio.run(run())


def test_an_unreachable_service_is_waited_for_then_named() -> None:
    async def run() -> None:
        leases = LeasePool(f"http://127.0.0.1:{free_port()}", holder="t", wait=1.2)
        try:
            await leases.acquire("shop.example")
        finally:
            await leases.aclose()

    started = time.monotonic()
    with pytest.raises(NoProxyAvailable, match="unreachable"):
        asyncio.run(run())
    assert time.monotonic() - started >= 1.2


def test_a_refusal_that_waiting_cannot_change_is_raised_at_once(tmp_path: Path) -> None:
    server = start_server(tmp_path, [4100], token="the-token-" + "x" * 30)
    try:

        async def run() -> None:
            leases = LeasePool(server.url, holder="t", token="wrong", wait=30)
            try:
                await leases.acquire("shop.example")
            finally:
                await leases.aclose()

        started = time.monotonic()
        with pytest.raises(Exception, match="401 unauthorized"):
            asyncio.run(run())
        assert time.monotonic() - started < 5
    finally:
        server.stop()


# -- the httpx transport when a proxy fails ----------------------------------------------------


class FakeProxy:
    """Answers every proxied request with one status (a proxy that refuses
    credentials says 407; one that works passes on the page)."""

    def __init__(self, status: int, body: bytes = b"") -> None:
        self.status = status
        self.body = body
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests.append(self.path)
                self.send_response(fake.status)
                self.send_header("Content-Length", str(len(fake.body)))
                self.end_headers()
                self.wfile.write(fake.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_connection_error_through_a_proxy_is_reported_and_raised(tmp_path: Path) -> None:
    server = start_server(tmp_path, [free_port()])  # healthy by verdict, nothing listens
    try:
        transport = DiscoveryTransport(server.url)
        with httpx.Client(transport=transport) as client, pytest.raises(httpx.ConnectError):
            client.get("http://shop.example/")
        assert server.fake is not None
        assert [name for name, _ in server.fake.errors] == ["p0"]  # counted as a failed probe
        assert transport.stats["reports/error"] == 1
        with httpx.Client(base_url=server.url) as http:
            assert leased(http) == set()
    finally:
        server.stop()


def test_a_proxy_refusing_its_credentials_is_reported_and_the_next_one_used(
    tmp_path: Path,
) -> None:
    refusing, working = FakeProxy(407), FakeProxy(200, b"the page")
    server = start_server(tmp_path, [refusing.port, working.port])
    try:
        transport = DiscoveryTransport(server.url)
        with httpx.Client(transport=transport) as client:
            answers = [client.get(f"http://shop.example/{n}") for n in range(3)]
        assert [(a.status_code, a.text) for a in answers] == [(200, "the page")] * 3
        assert len(refusing.requests) <= 1 and len(working.requests) == 3
        assert transport.stats["reports/error"] == len(refusing.requests)
    finally:
        server.stop()
        refusing.close()
        working.close()


def test_when_ban_retries_run_out_the_last_banned_answer_is_returned(tmp_path: Path) -> None:
    banning = [FakeProxy(403, b"banned"), FakeProxy(403, b"banned")]
    server = start_server(tmp_path, [p.port for p in banning])
    try:
        transport = DiscoveryTransport(server.url, ban_retries=1)
        with httpx.Client(transport=transport) as client:
            answer = client.get("http://shop.example/")
            assert (answer.status_code, answer.text) == (403, "banned")
            assert answer.elapsed.total_seconds() >= 0
        assert [len(p.requests) for p in banning] == [1, 1]
        assert dict(transport.stats) == {
            "requests": 2,
            "bans": 2,
            "retries": 1,
            "retries/exhausted": 1,
            "reports/blocked": 2,
            "leases/granted": 2,
            "leases/released": 2,
        }
        with httpx.Client(base_url=server.url) as http:
            listed = proxies(http)
        assert all(
            [c["target"] for c in p["cooldowns"]] == ["shop.example"] for p in listed.values()
        )
    finally:
        server.stop()
        for proxy in banning:
            proxy.close()


def test_a_body_read_for_the_ban_check_reaches_the_caller_whole(tmp_path: Path) -> None:
    page = FakeProxy(200, b"x" * 100_000)
    server = start_server(tmp_path, [page.port])
    try:
        transport = DiscoveryTransport(server.url, ban_body="captcha")
        with httpx.Client(transport=transport) as client:
            answer = client.get("http://shop.example/")
            assert answer.content == b"x" * 100_000
            assert answer.elapsed.total_seconds() >= 0
            with client.stream("GET", "http://shop.example/") as streamed:
                assert sum(len(c) for c in streamed.iter_bytes()) == 100_000
        wait_for(lambda: transport.stats["leases/released"] == 1)
    finally:
        server.stop()
        page.close()
