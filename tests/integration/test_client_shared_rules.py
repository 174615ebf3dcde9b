"""The client's rules that exist once and run in several places, each test
run against each: the grant loop (`alease()` and the pool under the
adapters) and the verdict on an answer through a proxy (the httpx
transports and the Scrapy middleware), a 407 on CONNECT included. In
process against the real app (tests/support/crawler_pool.py), or on a
socket where the proxy is one too; the rules themselves, as tables, are in
tests/unit/test_client_rules.py, the renew loop's users in
test_client_renewals.py."""

from __future__ import annotations

import asyncio
from collections import Counter
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
    fake_health,
    fleet_settings,
    pool,
    service,
)
from tests.support.discovery import ServerThread

# -- one grant loop: alease() and the pool ---------------------------------------------------------


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
def test_an_unreachable_service_is_waited_for_then_named(kind: str, refused: str) -> None:
    sleeps = Sleeps()
    unreachable = f"http://{refused}"
    with pytest.raises(NoProxyAvailable, match="unreachable"):
        asyncio.run(first_lease(kind, unreachable, sleeps, http=None, token=""))
    # Asked again after a pause, never sleeping past `wait` (the attempts
    # themselves take some of it: on a busy machine one pause may be all
    # that fits before the deadline).
    assert len(sleeps.asked) >= 1 and sum(sleeps.asked) <= 1.2, sleeps.asked


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
