"""The lease pool under the crawler adapters (egress_proxies_client.LeasePool)
and the httpx transports when a proxy fails: leases per site, bans and
cooldowns per site, waiting on Retry-After, renewal, idle and lost leases,
release on close, refused credentials, connection errors, ban retries.

The logic runs in this process against the real ASGI app (every layer of
it, through httpx.ASGITransport, with health verdicts from a fake) and, for
the transports, proxies answered by httpx.MockTransport. A test uses
sockets for what only sockets show (the sync transport's thread and
streamed bodies). The rules the pool shares with alease() (refusals, an
unreachable service) and the transports with the Scrapy middleware (the
verdict) are tested against both in test_client_shared_rules.py, the renew
loop against each of its users in test_client_renewals.py. The
real crawls through squids are in test_crawlers.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.test import get_crawler

from egress_proxies_client import (
    AsyncDiscoveryTransport,
    DiscoveryTransport,
    NoProxyAvailable,
    PoolClosed,
    alease,
)
from egress_proxies_client._bans import BanPolicy
from egress_proxies_client.scrapy import DiscoveryProxyMiddleware
from tests.support.crawler_pool import (
    URL,
    Sleeps,
    eventually,
    fake_health,
    fleet_settings,
    leased,
    listed,
    pool,
    proxies_answering,
    service,
)
from tests.support.discovery import ServerThread, wait_for
from tests.support.http import LoopbackServer, QuietHandler


def test_a_site_holds_its_leases_and_spreads_requests_over_them(tmp_path: Path) -> None:
    counts: Counter[str] = Counter()

    async def run() -> None:
        async with service(tmp_path) as (http, _):
            leases = pool(http, counts, per_site=2, wait=0)
            try:
                used = [await leases.acquire("a.example") for _ in range(4)]
                assert len({h.id for h in used}) == 2
                assert [h.name for h in used[:2]] == [h.name for h in used[2:]]  # in turn
                other = await leases.acquire("b.example")
                assert other.name not in {h.name for h in used}
                assert await leased(http) == {"p0", "p1", "p2"}
                # The fleet is taken: c.example gets nothing, at once (wait=0).
                with pytest.raises(
                    NoProxyAvailable, match=r"no proxy for c\.example after waiting 0 s"
                ):
                    await leases.acquire("c.example")
            finally:
                await leases.aclose()
            assert await leased(http) == set()

    asyncio.run(run())
    assert counts == {
        "leases/granted": 3,
        "leases/released": 3,
        "leases/denied": 1,
        "no_proxy": 1,
    }


def test_a_ban_rests_the_proxy_for_that_site_only(tmp_path: Path) -> None:
    async def run() -> None:
        async with service(tmp_path) as (http, _):
            leases = pool(http, wait=0)
            try:
                first = await leases.acquire("shop.example")
                assert await leases.blocked(first)
                assert not await leases.blocked(first)  # banned again (in flight): nothing more
                assert leases.lookup(first.id) is None
                again = await leases.acquire("shop.example")
                assert again.name != first.name
                # Another site may have the banned proxy.
                sites = ("x.example", "y.example")
                names = {(await leases.acquire(site)).name for site in sites}
                assert first.name in names
            finally:
                await leases.aclose()
            cooling = {
                n: [c["target"] for c in p["cooldowns"]] for n, p in (await listed(http)).items()
            }
            assert sorted(cooling.values()) == [[], [], ["shop.example"]]

    asyncio.run(run())


def test_waits_what_retry_after_says_then_gets_the_proxy(tmp_path: Path) -> None:
    counts: Counter[str] = Counter()
    sleeps = Sleeps()

    async def run() -> None:
        # Another crawler holds the only proxy for 2 s, without renewing.
        async with (
            service(tmp_path, [4100]) as (http, _),
            alease(URL, "other", ttl=2, renew=False, http=http),
        ):
            leases = pool(http, counts, wait=10, sleep=sleeps)
            try:
                held = await leases.acquire("shop.example")
            finally:
                await leases.aclose()
        assert held.name == "p0"

    asyncio.run(run())
    # Denied first; a busy machine's expiry sweep (once a second, real time
    # here) may not have ended the other lease by the retry, so perhaps again.
    assert counts["leases/denied"] >= 1
    # Retry-After: 2 (the other lease's end), with up to 10 % of jitter.
    assert 1.9 <= sleeps.asked[0] <= 2.2 + 0.01, sleeps.asked


def test_renews_a_lease_in_use_past_its_ttl(tmp_path: Path) -> None:
    async def run() -> None:
        async with service(tmp_path) as (http, _):
            leases = pool(http, ttl=1.2, idle=None)
            try:
                held = await leases.acquire("shop.example")
                first_expiry = held.expires_at
                await eventually(lambda: held.expires_at > first_expiry + 1)
                assert leases.lookup(held.id) is held
                renewed = await http.post(f"/v1/leases/{held.id}/renew")
                assert renewed.status_code == 200  # still the service's
            finally:
                await leases.aclose()

    asyncio.run(run())


def test_gives_back_a_lease_nobody_used_for_idle_seconds(tmp_path: Path) -> None:
    counts: Counter[str] = Counter()

    async def run() -> None:
        async with service(tmp_path) as (http, _):
            leases = pool(http, counts, idle=0.4)
            try:
                held = await leases.acquire("shop.example")
                busy = await leases.acquire("busy.example")  # in use (never done) the whole time
                leases.done(held)
                await eventually(lambda: counts["leases/released"] == 1)  # given back, answered
                assert leases.lookup(held.id) is None
                assert leases.lookup(busy.id) is busy
                assert await leased(http) == {busy.name}
            finally:
                await leases.aclose()

    asyncio.run(run())
    assert counts["leases/idle"] == 1
    assert counts["leases/released"] == 2


def test_a_lease_the_service_ended_is_dropped_and_replaced(tmp_path: Path) -> None:
    counts: Counter[str] = Counter()

    async def run() -> None:
        async with service(tmp_path) as (http, _):
            leases = pool(http, counts, ttl=1.0)  # the service's minimum
            try:
                held = await leases.acquire("shop.example")
                assert (await http.delete(f"/v1/leases/{held.id}")).status_code == 204
                # The next renewal (at a third of 1 s) hears 404.
                await eventually(lambda: leases.lookup(held.id) is None)
                replacement = await leases.acquire("shop.example")
                assert replacement.id != held.id
            finally:
                await leases.aclose()

    asyncio.run(run())
    assert counts["leases/lost"] == 1


def test_close_releases_every_lease_and_ends_the_pool(tmp_path: Path) -> None:
    async def run() -> None:
        async with service(tmp_path) as (http, _):
            leases = pool(http)
            for site in ("a.example", "b.example", "c.example"):
                await leases.acquire(site)
            assert await leased(http) == {"p0", "p1", "p2"}
            await leases.aclose()
            await leases.aclose()  # again: nothing
            assert await leased(http) == set()
            with pytest.raises(PoolClosed):
                await leases.acquire("a.example")

    asyncio.run(run())


class GrantGate(httpx.AsyncBaseTransport):
    """The service's transport, holding each grant (POST /v1/leases) until
    `release` is set, so a test can act while one is under way."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/leases":
            self.entered.set()
            await self.release.wait()
        return await self.inner.handle_async_request(request)


def test_a_lease_granted_while_the_pool_closes_is_given_back(tmp_path: Path) -> None:
    async def run() -> None:
        async with service(tmp_path) as (http, _):
            gate = GrantGate(http._transport)
            async with httpx.AsyncClient(transport=gate, base_url=URL) as gated:
                leases = pool(gated)
                acquiring = asyncio.create_task(leases.acquire("shop.example"))
                await gate.entered.wait()
                closing = asyncio.create_task(leases.aclose())
                await asyncio.sleep(0)  # aclose() has begun: the pool is closed
                assert leases.closed
                gate.release.set()  # now the service grants
                with pytest.raises(PoolClosed):
                    await acquiring
                await closing
            assert await leased(http) == set(), "the late grant must be released at once"

    asyncio.run(run())


def test_the_scrapy_middleware_sends_nothing_once_the_pool_is_closed(tmp_path: Path) -> None:
    """A request must never leave from the crawler's own address: with the
    pool closed (the spider closing) it is dropped, not sent without a proxy."""
    crawler = get_crawler(Spider)

    async def run() -> Request:
        async with service(tmp_path) as (http, _):
            leases = pool(http)
            await leases.aclose()
            middleware = DiscoveryProxyMiddleware(
                crawler, leases, BanPolicy(), ban_retries=5, error_exceptions=()
            )
            request = Request("https://shop.example/page")
            with pytest.raises(IgnoreRequest):
                await middleware.process_request(request)
            return request

    request = asyncio.run(run())
    assert request.meta.get("proxy") is None


# -- the httpx transports when a proxy fails -------------------------------------------------


def test_a_connection_error_through_a_proxy_is_reported_and_raised(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def run() -> None:
        async with service(tmp_path, [4100]) as (http, running):
            transport = AsyncDiscoveryTransport(
                URL, http=http, proxy_transport=proxies_answering({4100: refuse})
            )
            async with httpx.AsyncClient(transport=transport) as client:
                with pytest.raises(httpx.ConnectError):
                    await client.get("http://shop.example/")
            assert [name for name, _ in fake_health(running).errors] == ["p0"]  # a failed probe
            assert transport.stats["reports/error"] == 1
            assert await leased(http) == set()

    asyncio.run(run())


def test_a_proxy_refusing_its_credentials_is_reported_and_the_next_one_used(
    tmp_path: Path,
) -> None:
    proxy = proxies_answering(
        {
            4100: lambda r: httpx.Response(407),
            4101: lambda r: httpx.Response(200, content=b"the page"),
        }
    )

    async def run() -> None:
        async with service(tmp_path, [4100, 4101]) as (http, _):
            transport = AsyncDiscoveryTransport(URL, http=http, proxy_transport=proxy)
            async with httpx.AsyncClient(transport=transport) as client:
                answers = [await client.get(f"http://shop.example/{n}") for n in range(3)]
            assert [(a.status_code, a.text) for a in answers] == [(200, "the page")] * 3
            assert len(proxy.seen[4100]) <= 1 and len(proxy.seen[4101]) == 3
            assert transport.stats["reports/error"] == len(proxy.seen[4100])

    asyncio.run(run())


def test_when_ban_retries_run_out_the_last_banned_answer_is_returned(tmp_path: Path) -> None:
    def banned(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, content=b"banned")

    proxy = proxies_answering({4100: banned, 4101: banned})

    async def run() -> None:
        async with service(tmp_path, [4100, 4101]) as (http, _):
            transport = AsyncDiscoveryTransport(
                URL, http=http, ban_retries=1, proxy_transport=proxy
            )
            async with httpx.AsyncClient(transport=transport) as client:
                answer = await client.get("http://shop.example/")
                assert (answer.status_code, answer.text) == (403, "banned")
            assert [len(proxy.seen[port]) for port in (4100, 4101)] == [1, 1]
            assert dict(transport.stats) == {
                "requests": 2,
                "bans": 2,
                "retries": 1,
                "retries/exhausted": 1,
                "reports/blocked": 2,
                "leases/granted": 2,
                "leases/released": 2,
            }
            assert all(
                [c["target"] for c in p["cooldowns"]] == ["shop.example"]
                for p in (await listed(http)).values()
            )

    asyncio.run(run())


# -- the sync transport over sockets: its own thread and loop, streamed bodies ----------------


def start_server(tmp_path: Path, ports: list[int], **options: Any) -> ServerThread:
    return ServerThread(fleet_settings(tmp_path, ports, **options)).start()


class FakeProxy(LoopbackServer):
    """Answers every proxied request with one status (a proxy that refuses
    credentials says 407; one that works passes on the page)."""

    def __init__(self, status: int, body: bytes = b"") -> None:
        self.status = status
        self.body = body
        self.requests: list[str] = []
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                fake.requests.append(self.path)
                self.send_response(fake.status)
                self.send_header("Content-Length", str(len(fake.body)))
                self.end_headers()
                self.wfile.write(fake.body)

        super().__init__(Handler)


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
