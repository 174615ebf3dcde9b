"""The client's rules that exist once and run in two places, each test run
against both: the grant-and-renew loop (`alease()` and the pool under the
adapters) and the verdict on an answer through a proxy (the httpx transports
and the Scrapy middleware), a 407 on CONNECT included. In process against
the real app (tests/support/crawler_pool.py), or on a socket where the proxy
is one too; the rules themselves, as tables, are in
tests/unit/test_client_rules.py."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrapy import Request, Spider
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.http import Response
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from egress_proxies_client import (
    AsyncDiscoveryTransport,
    BanPolicy,
    DiscoveryError,
    DiscoveryTransport,
    LeasePool,
    NoProxyAvailable,
    alease,
)
from egress_proxies_client._loop import LoopThread
from egress_proxies_client.scrapy import DEFAULT_ERROR_EXCEPTIONS, DiscoveryProxyMiddleware
from tests.support.crawler_pool import (
    URL,
    RefusingProxy,
    Sleeps,
    cooling,
    eventually,
    fake_health,
    fleet_settings,
    leased,
    pool,
    proxies_answering,
    service,
)
from tests.support.discovery import ServerThread, free_port

MOVED_PORT = 4199  # where a renewal says the proxy moved to


class Renewals(httpx.AsyncBaseTransport):
    """The service's transport, its renewals (POST .../renew) answered as
    `plan` says, in turn, then as `then`: `unreachable` (a ConnectError),
    `failing` (a 503 error answer), `moved` (the service's answer with the
    proxy on MOVED_PORT), `through` (the service's answer). `got` lists what
    each renewal was given."""

    def __init__(self, inner: httpx.AsyncBaseTransport, plan: list[str], then: str) -> None:
        self.inner = inner
        self.plan = list(plan)
        self.then = then
        self.got: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not (request.method == "POST" and request.url.path.endswith("/renew")):
            return await self.inner.handle_async_request(request)
        step = self.plan.pop(0) if self.plan else self.then
        self.got.append(step)
        if step == "unreachable":
            raise httpx.ConnectError("connection refused", request=request)
        if step == "failing":
            return httpx.Response(503, json={"error": "unavailable", "detail": "try again"})
        answer = await self.inner.handle_async_request(request)
        if step == "moved" and answer.status_code == 200:
            body = json.loads(await answer.aread())
            body["proxy"]["url"] = str(httpx.URL(body["proxy"]["url"]).copy_with(port=MOVED_PORT))
            return httpx.Response(200, json=body)
        return answer


@asynccontextmanager
async def renewing(
    tmp_path: Path, plan: list[str], then: str = "through"
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, Renewals]]:
    """(the service's client, a client whose renewals go as planned, the plan)."""
    async with service(tmp_path, [4100]) as (http, _):
        renewals = Renewals(http._transport, plan, then)
        async with httpx.AsyncClient(transport=renewals, base_url=URL) as planned:
            yield http, planned, renewals


# -- one grant-and-renew loop: alease() and the pool -----------------------------------------


@dataclass
class Seen:
    id: str
    url: str
    expires_at: float  # epoch seconds
    lost: bool


@asynccontextmanager
async def one_lease(
    kind: str, http: httpx.AsyncClient, ttl: float
) -> AsyncIterator[Callable[[], Seen]]:
    """A lease held by `alease()` or by the pool (for shop.example), and how it looks now."""
    if kind == "alease":
        async with alease(URL, "keeper", ttl=ttl, wait=0, token="", http=http) as proxy:
            yield lambda: Seen(proxy.id, proxy.url, proxy.expires_at.timestamp(), proxy.lost)
        return
    leases = pool(http, ttl=ttl, idle=None, wait=0)
    try:
        held = await leases.acquire("shop.example")
        yield lambda: Seen(held.id, held.url, held.expires_at, leases.lookup(held.id) is None)
    finally:
        await leases.aclose()


KEEPERS = ["alease", "pool"]


async def first_lease(
    kind: str, base_url: str, sleeps: Sleeps, *, http: httpx.AsyncClient | None, token: str
) -> None:
    """Asks for one lease (for shop.example, waiting at most 1.2 s) by
    `alease()` or by the pool."""
    if kind == "alease":
        options: dict[str, Any] = {"target": "shop.example", "token": token, "wait": 1.2}
        async with alease(base_url, "t", http=http, sleep=sleeps, **options):
            return
    leases = LeasePool(base_url, holder="t", token=token, wait=1.2, http=http, sleep=sleeps)
    try:
        await leases.acquire("shop.example")
    finally:
        await leases.aclose()


@pytest.mark.parametrize("kind", KEEPERS)
def test_a_refusal_that_waiting_cannot_change_is_raised_at_once(tmp_path: Path, kind: str) -> None:
    sleeps = Sleeps()

    async def run() -> None:
        async with service(tmp_path, [4100], token="the-token-" + "x" * 30) as (http, _):
            await first_lease(kind, URL, sleeps, http=http, token="wrong")

    with pytest.raises(DiscoveryError, match="401 unauthorized"):
        asyncio.run(run())
    assert sleeps.asked == []  # never waited


@pytest.mark.parametrize("kind", KEEPERS)
def test_an_unreachable_service_is_waited_for_then_named(kind: str) -> None:
    sleeps = Sleeps()
    unreachable = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NoProxyAvailable, match="unreachable"):
        asyncio.run(first_lease(kind, unreachable, sleeps, http=None, token=""))
    # Asked again after a pause, never sleeping past `wait` (the attempts
    # themselves take some of it: on a busy machine one pause may be all
    # that fits before the deadline).
    assert len(sleeps.asked) >= 1 and sum(sleeps.asked) <= 1.2, sleeps.asked


@pytest.mark.parametrize("kind", KEEPERS)
def test_failed_renewals_do_not_stop_the_renewals(tmp_path: Path, kind: str) -> None:
    async def run() -> None:
        async with renewing(tmp_path, ["unreachable", "failing"]) as (http, planned, renewals):
            async with one_lease(kind, planned, ttl=4) as seen:
                first = seen()
                await eventually(lambda: seen().expires_at > first.expires_at)
                assert renewals.got[:3] == ["unreachable", "failing", "through"]
                assert not seen().lost
                assert await leased(http) == {"p0"}
            assert await leased(http) == set()

    asyncio.run(run())


@pytest.mark.parametrize("kind", KEEPERS)
def test_a_renewal_naming_another_proxy_url_is_taken(tmp_path: Path, kind: str) -> None:
    async def run() -> None:
        async with (
            renewing(tmp_path, ["moved"]) as (_, planned, renewals),
            one_lease(kind, planned, ttl=1.2) as seen,
        ):
            assert httpx.URL(seen().url).port == 4100
            await eventually(lambda: httpx.URL(seen().url).port == MOVED_PORT)
            assert renewals.got[0] == "moved" and not seen().lost

    asyncio.run(run())


@pytest.mark.parametrize("kind", KEEPERS)
def test_a_lease_the_service_ended_is_lost(tmp_path: Path, kind: str) -> None:
    async def run() -> None:
        async with renewing(tmp_path, []) as (http, planned, renewals):
            async with one_lease(kind, planned, ttl=1.0) as seen:
                assert (await http.delete(f"/v1/leases/{seen().id}")).status_code == 204
                await eventually(lambda: seen().lost)  # the next renewal heard 404
            assert renewals.got == ["through"]

    asyncio.run(run())


@pytest.mark.parametrize("kind", KEEPERS)
def test_a_lease_that_ran_out_while_no_renewal_got_through_is_lost(
    tmp_path: Path, kind: str
) -> None:
    async def run() -> None:
        async with renewing(tmp_path, [], then="unreachable") as (http, planned, renewals):
            async with one_lease(kind, planned, ttl=1.0) as seen:
                await eventually(lambda: seen().lost)
                assert len(renewals.got) >= 2  # tried again after the first failure
                assert set(renewals.got) == {"unreachable"}
            assert await leased(http) == set()

    asyncio.run(run())


def test_the_httpx_transport_sends_through_the_url_a_renewal_names(tmp_path: Path) -> None:
    def page(text: str) -> Callable[[httpx.Request], httpx.Response]:
        return lambda request: httpx.Response(200, content=text.encode())

    proxy = proxies_answering({4100: page("old"), MOVED_PORT: page("moved")})

    async def run() -> None:
        async with renewing(tmp_path, ["moved"]) as (_, planned, renewals):
            transport = AsyncDiscoveryTransport(
                URL, http=planned, ttl=1.2, idle=None, proxy_transport=proxy
            )
            async with httpx.AsyncClient(transport=transport) as client:
                assert (await client.get("http://shop.example/a")).text == "old"
                [held] = transport.pool.leases()
                await eventually(lambda: httpx.URL(held.url).port == MOVED_PORT)
                assert renewals.got == ["moved"]
                assert (await client.get("http://shop.example/b")).text == "moved"
            assert transport.stats["leases/granted"] == 1

    asyncio.run(run())
    assert proxy.seen == {4100: ["/a"], MOVED_PORT: ["/b"]}


# -- one verdict: the httpx transport and the Scrapy middleware ------------------------------

Answer = tuple[int, dict[str, str], bytes]
PAGE: Answer = (200, {}, b"the page")
REFUSED: Answer = (407, {}, b"")  # the proxy refused its credentials
BANNED: Answer = (403, {}, b"banned")
SQUID_ERROR: Answer = (503, {"X-Squid-Error": "ERR_CONNECT_FAIL 111"}, b"squid: no route")


@dataclass
class Fetched:
    status: int  # what the crawler got in the end
    tries: int  # sends through a proxy
    counts: dict[str, int]  # the adapter's stats, without Scrapy's `discovery/`


async def fetch(adapter: str, http: httpx.AsyncClient, answers: list[Answer]) -> Fetched:
    """GET http://shop.example/ through `adapter`; the n-th send through a
    proxy gets answers[n] (the last one from then on)."""
    sent = 0

    def answer() -> Answer:
        nonlocal sent
        sent += 1
        return answers[min(sent, len(answers)) - 1]

    if adapter == "httpx":

        def handle(request: httpx.Request) -> httpx.Response:
            status, headers, body = answer()
            return httpx.Response(status, headers=headers, content=body)

        transport = AsyncDiscoveryTransport(
            URL, http=http, wait=0, proxy_transport=lambda url: httpx.MockTransport(handle)
        )
        async with httpx.AsyncClient(transport=transport) as client:
            status = (await client.get("http://shop.example/")).status_code
        return Fetched(status, sent, dict(transport.stats))
    # Scrapy: the middleware's two hooks around a download, as the engine calls them.
    crawler = get_crawler(Spider)
    counts: Counter[str] = Counter()
    leases = pool(http, counts, wait=0)
    middleware = DiscoveryProxyMiddleware(
        crawler, leases, BanPolicy(), ban_retries=5, error_exceptions=()
    )
    request = Request("http://shop.example/")
    try:
        while True:
            await middleware.process_request(request)
            status, headers, body = answer()
            response = Response(request.url, status=status, headers=headers, body=body)
            got = await middleware.process_response(request, response)
            if isinstance(got, Response):
                break
            request = got
    finally:
        await leases.aclose()
    assert crawler.stats is not None
    stats = {k.removeprefix("discovery/"): v for k, v in crawler.stats.get_stats().items()}
    return Fetched(got.status, sent, {**stats, **counts})


def interesting(counts: dict[str, Any]) -> dict[str, Any]:
    keys = ("bans", "reports/blocked", "reports/error", "retries", "retries/exhausted")
    return {k: counts[k] for k in keys if k in counts}


ADAPTERS = ["httpx", "scrapy"]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_407_is_the_proxys_error_and_the_request_goes_through_another(
    tmp_path: Path, adapter: str
) -> None:
    async def run() -> None:
        async with service(tmp_path, [4100, 4101]) as (http, running):
            fetched = await fetch(adapter, http, [REFUSED, PAGE])
            assert (fetched.status, fetched.tries) == (200, 2)
            assert interesting(fetched.counts) == {"reports/error": 1, "retries": 1}
            assert len(fake_health(running).errors) == 1  # against its health
            assert all(c == [] for c in (await cooling(http)).values())  # not a ban

    asyncio.run(run())


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_ban_is_reported_blocked_for_the_site_and_the_request_goes_through_another(
    tmp_path: Path, adapter: str
) -> None:
    async def run() -> None:
        async with service(tmp_path, [4100, 4101]) as (http, running):
            fetched = await fetch(adapter, http, [BANNED, PAGE])
            assert (fetched.status, fetched.tries) == (200, 2)
            assert interesting(fetched.counts) == {"bans": 1, "reports/blocked": 1, "retries": 1}
            assert fake_health(running).errors == []
            assert sorted((await cooling(http)).values()) == [[], ["shop.example"]]

    asyncio.run(run())


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_squid_error_page_is_passed_on_and_reported_as_nothing(
    tmp_path: Path, adapter: str
) -> None:
    async def run() -> None:
        async with service(tmp_path, [4100, 4101]) as (http, running):
            fetched = await fetch(adapter, http, [SQUID_ERROR, PAGE])
            assert (fetched.status, fetched.tries) == (503, 1)
            assert interesting(fetched.counts) == {}
            assert fake_health(running).errors == []
            assert all(c == [] for c in (await cooling(http)).values())

    asyncio.run(run())


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_when_retries_run_out_the_last_bad_answer_is_passed_on(
    tmp_path: Path, adapter: str
) -> None:
    async def run() -> None:
        # Six proxies: one first send and five retries (the default), each on another.
        async with service(tmp_path, list(range(4100, 4106))) as (http, _):
            fetched = await fetch(adapter, http, [BANNED])
            assert (fetched.status, fetched.tries) == (403, 6)
            assert interesting(fetched.counts) == {
                "bans": 6,
                "reports/blocked": 6,
                "retries": 5,
                "retries/exhausted": 1,
            }

    asyncio.run(run())


# -- a 407 on CONNECT (an https site): the proxy's error, in every adapter --------------------


async def scrapy_download_refused(middleware: DiscoveryProxyMiddleware, port: int) -> None:
    """What the engine does when the proxy refuses the CONNECT: the
    middleware's two hooks, with the TunnelError Scrapy's HTTP/1.1 handler
    raises (its message)."""
    request = Request("https://shop.example/")
    await middleware.process_request(request)
    refused = TunnelError(
        f"Could not open CONNECT tunnel with proxy 127.0.0.1:{port} "
        "[{'status': 407, 'reason': b'Proxy Authentication Required'}]"
    )
    await middleware.process_exception(request, refused)  # Scrapy's RetryMiddleware decides next


@pytest.mark.parametrize("adapter", ["httpx-async", "httpx-sync", "scrapy"])
def test_a_refused_connect_is_the_proxys_error_never_a_ban(tmp_path: Path, adapter: str) -> None:
    refusing = RefusingProxy()
    server = ServerThread(fleet_settings(tmp_path, [refusing.port])).start()
    loop = LoopThread()
    try:
        if adapter == "httpx-sync":
            sync = DiscoveryTransport(server.url, token="", wait=0)
            with httpx.Client(transport=sync) as client, pytest.raises(httpx.ProxyError):
                client.get("https://shop.example/")
            counts = dict(sync.stats)
        elif adapter == "httpx-async":
            transport = AsyncDiscoveryTransport(server.url, token="", wait=0)

            async def get() -> None:
                async with httpx.AsyncClient(transport=transport) as client:
                    await client.get("https://shop.example/")

            with pytest.raises(httpx.ProxyError):
                loop.run(get())
            counts = dict(transport.stats)
        else:
            crawler = get_crawler(Spider)
            stats = crawler.stats
            assert stats is not None
            leases = LeasePool(
                server.url,
                holder="scrapy",
                token="",
                wait=0,
                count=lambda key, n: stats.inc_value(f"discovery/{key}", n),
            )
            # The middleware's own defaults, as from_crawler loads them.
            errors = tuple(load_object(path) for path in DEFAULT_ERROR_EXCEPTIONS)
            middleware = DiscoveryProxyMiddleware(
                crawler, leases, BanPolicy(), ban_retries=5, error_exceptions=errors
            )
            try:
                loop.run(scrapy_download_refused(middleware, refusing.port))
            finally:
                loop.run(leases.aclose())
            counts = {k.removeprefix("discovery/"): v for k, v in stats.get_stats().items()}
        if adapter != "scrapy":  # (Scrapy's download is the TunnelError it would raise)
            assert refusing.connects == ["shop.example:443"]
        assert interesting(counts) == {"reports/error": 1}
        assert server.fake is not None
        assert [name for name, _ in server.fake.errors] == ["p0"]  # against its health
        proxies = httpx.get(f"{server.url}/v1/proxies").json()["proxies"]
        assert [(p["cooldowns"], p["leased"]) for p in proxies] == [([], False)]  # no ban
    finally:
        loop.stop()
        server.stop()
        refusing.close()
