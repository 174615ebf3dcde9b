"""The renew loop (_leasing.keep) as each of its users runs it, one sleep at
a time on a clock the test moves (tests/support/client_time.py), which the
service shares: `alease()`, `lease()` (its own loop thread) and the pool
keep renewing through failed renewals, with backoff, until the lease ends or
is released; a renewal that names another proxy URL is what the next
request goes through, in `alease()`/`lease()`, the pool, both httpx
transports and the Scrapy middleware.

The service is the real app on a socket (tests/support/discovery.py's
ServerThread); the client's renewals go through `Renewals`, which answers
some of them itself (unreachable, a 503 as during a PostgreSQL failover, a
moved proxy). Each async user runs on a loop in a thread of its own, as
`lease()` does, so one test body drives them all."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from egress_proxies_client import (
    AsyncDiscoveryTransport,
    BanPolicy,
    DiscoveryTransport,
    LeasePool,
    alease,
    lease,
)
from egress_proxies_client._loop import LoopThread
from egress_proxies_client.scrapy import DiscoveryProxyMiddleware
from tests.support.client_time import EPOCH, StoppedClock
from tests.support.crawler_pool import fleet_settings, proxies_answering
from tests.support.discovery import ServerThread

MOVED_PORT = 4199  # where a renewal says the proxy moved to
TTL = 60.0  # the lease's: renewed at a third of what is left, 20 s


class Renewals(httpx.AsyncBaseTransport):
    """The service's transport, its renewals (POST .../renew) answered as
    `plan` says, in turn, then as `then`: `unreachable` (a ConnectError),
    `failing` (a 503 error answer), `moved` (the service's answer with the
    proxy on MOVED_PORT), `through` (the service's answer). `got` lists what
    each renewal was given."""

    def __init__(self, plan: list[str], then: str) -> None:
        # No kept connection: each user's loop ends before the test does.
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
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
            return httpx.Response(503, json={"error": "unavailable", "detail": "failing over"})
        answer = await self.inner.handle_async_request(request)
        if step == "moved" and answer.status_code == 200:
            body = json.loads(await answer.aread())
            body["proxy"]["url"] = str(httpx.URL(body["proxy"]["url"]).copy_with(port=MOVED_PORT))
            return httpx.Response(200, json=body)
        return answer


@dataclass
class World:
    server: ServerThread
    clock: StoppedClock
    renewals: Renewals

    def client(self) -> httpx.AsyncClient:
        """To the service, renewals as planned (use it on one loop)."""
        return httpx.AsyncClient(transport=self.renewals, base_url=self.server.url)

    def leased(self) -> set[str]:
        proxies = httpx.get(f"{self.server.url}/v1/proxies").json()["proxies"]
        return {p["name"] for p in proxies if p["leased"]}

    def step(self) -> float:
        """Wakes the sleeping renew loop; what it asks to sleep next."""
        self.clock.wake()
        return self.clock.next_sleep()


@contextmanager
def world(tmp_path: Path, plan: list[str], then: str = "through") -> Iterator[World]:
    """The service with one proxy (p0 on 4100), on the stopped clock."""
    clock = StoppedClock()
    with ServerThread(fleet_settings(tmp_path, [4100]), clock=clock.time) as server:
        yield World(server, clock, Renewals(plan, then))


@dataclass
class Seen:
    id: str
    url: str
    expires_at: float  # epoch seconds
    lost: bool


@contextmanager
def holding(kind: str, w: World) -> Iterator[Callable[[], Seen]]:
    """A lease for shop.example held by `kind` (alease, lease, pool), and how it looks now."""
    clock = w.clock
    # What both managers are given alike; each gets its own client.
    terms: dict[str, Any] = {
        "sleep": clock.sleep,
        "clock": clock,
        "ttl": TTL,
        "wait": 0.0,
        "token": "",
    }
    if kind == "lease":
        with lease(w.server.url, "keeper", http=w.client(), **terms) as proxy:
            yield lambda: Seen(proxy.id, proxy.url, proxy.expires_at.timestamp(), proxy.lost)
        return
    loop = LoopThread()
    try:
        if kind == "alease":
            manager = alease(w.server.url, "keeper", http=w.client(), **terms)
            handle = loop.run(manager.__aenter__())
            try:
                yield lambda: Seen(
                    handle.id, handle.url, handle.expires_at.timestamp(), handle.lost
                )
            finally:
                loop.run(manager.__aexit__(None, None, None))
            return
        leases = LeasePool(
            w.server.url,
            holder="keeper",
            http=w.client(),
            sleep=clock.sleep,
            clock=clock,
            idle=None,
            ttl=TTL,
            wait=0.0,
            token="",
        )
        try:
            held = loop.run(leases.acquire("shop.example"))
            yield lambda: Seen(held.id, held.url, held.expires_at, leases.lookup(held.id) is None)
        finally:
            loop.run(leases.aclose())
    finally:
        loop.stop()


KEEPERS = ["alease", "lease", "pool"]


@pytest.mark.parametrize("kind", KEEPERS)
def test_failed_renewals_are_retried_with_backoff_past_the_leases_first_end(
    tmp_path: Path, kind: str
) -> None:
    with world(tmp_path, ["failing", "unreachable", "failing"]) as w:
        with holding(kind, w) as seen:
            granted = seen()
            assert granted.expires_at == EPOCH + TTL
            pauses = [w.clock.next_sleep()]
            while len(w.renewals.got) < 6:
                pauses.append(w.step())
            assert w.renewals.got == ["failing", "unreachable", "failing"] + ["through"] * 3
            # A third of the lease, then a backoff doubling from 0.5 s, then a third again.
            assert pauses == [20.0, 0.5, 1.0, 2.0, 20.0, 20.0, 20.0]
            now = seen()
            assert w.clock.time() == EPOCH + 63.5  # past the end it was granted with
            assert (now.id, now.lost, now.expires_at) == (granted.id, False, EPOCH + 63.5 + TTL)
            assert w.leased() == {"p0"}  # the service, on the same clock, still has it leased
        assert w.clock.sleeping() == 0  # released: the renew loop ended
        assert len(w.renewals.got) == 6
        assert w.leased() == set()


@pytest.mark.parametrize("kind", KEEPERS)
def test_renewals_that_keep_failing_go_on_until_the_lease_has_run_out(
    tmp_path: Path, kind: str
) -> None:
    with world(tmp_path, [], then="failing") as w, holding(kind, w) as seen:
        granted = seen()
        pauses = [w.clock.next_sleep()]
        while not seen().lost:
            w.clock.wake()
            pauses.append(w.clock.next_sleep(ended=lambda: seen().lost))
        assert pauses[:6] == [20.0, 0.5, 1.0, 2.0, 4.0, 5.0]  # up to MAX_BACKOFF
        assert pauses[-1] == 0.0  # no sleep after the end: lost
        assert set(w.renewals.got) == {"failing"} and len(w.renewals.got) == len(pauses) - 1
        assert w.clock.time() >= granted.expires_at  # not given up before the end
        assert w.clock.time() - granted.expires_at < 0.5  # tried until it ran out


@pytest.mark.parametrize("kind", KEEPERS)
def test_a_lease_the_service_ended_is_lost_at_the_next_renewal(tmp_path: Path, kind: str) -> None:
    with world(tmp_path, []) as w, holding(kind, w) as seen:
        assert httpx.delete(f"{w.server.url}/v1/leases/{seen().id}").status_code == 204
        w.clock.next_sleep()
        w.clock.wake()
        assert w.clock.next_sleep(ended=lambda: seen().lost) == 0.0
        assert w.renewals.got == ["through"]  # the service said 404


@pytest.mark.parametrize("kind", KEEPERS)
def test_a_renewal_naming_another_proxy_url_is_taken(tmp_path: Path, kind: str) -> None:
    with world(tmp_path, ["moved"]) as w, holding(kind, w) as seen:
        assert httpx.URL(seen().url).port == 4100
        w.clock.next_sleep()
        w.step()
        assert w.renewals.got == ["moved"]
        now = seen()
        assert (httpx.URL(now.url).port, now.lost) == (MOVED_PORT, False)


def page(text: str) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(200, content=text.encode())


@pytest.mark.parametrize("adapter", ["httpx-async", "httpx-sync", "scrapy"])
def test_the_next_request_goes_through_the_url_a_renewal_names(
    tmp_path: Path, adapter: str
) -> None:
    proxy = proxies_answering({4100: page("old"), MOVED_PORT: page("moved")})
    with world(tmp_path, ["moved"]) as w:
        send = {"httpx-async": async_sender, "httpx-sync": sync_sender, "scrapy": scrapy_sender}
        with send[adapter](w, proxy) as get:
            assert get("/a") == "old"
            w.clock.next_sleep()
            w.step()
            assert w.renewals.got == ["moved"]
            assert get("/b") == "moved"
    assert proxy.seen == {4100: ["/a"], MOVED_PORT: ["/b"]}


Sender = Callable[[str], str]


@contextmanager
def sync_sender(w: World, proxy: Any) -> Iterator[Sender]:
    transport = DiscoveryTransport(w.server.url, **transport_options(w, proxy))
    with httpx.Client(transport=transport) as client:
        yield lambda path: client.get(f"http://shop.example{path}").text


@contextmanager
def async_sender(w: World, proxy: Any) -> Iterator[Sender]:
    loop = LoopThread()
    transport = AsyncDiscoveryTransport(w.server.url, **transport_options(w, proxy))
    client = httpx.AsyncClient(transport=transport)

    async def get(path: str) -> str:
        return (await client.get(f"http://shop.example{path}")).text

    try:
        yield lambda path: loop.run(get(path))
        loop.run(client.aclose())
    finally:
        loop.stop()


def transport_options(w: World, proxy: Any) -> dict[str, Any]:
    return {
        "http": w.client(),
        "sleep": w.clock.sleep,
        "clock": w.clock,
        "proxy_transport": proxy,
        "idle": None,
        "ttl": TTL,
        "wait": 0.0,
        "token": "",
    }


@contextmanager
def scrapy_sender(w: World, proxy: Any) -> Iterator[Sender]:
    """The middleware's hooks as the engine calls them; the download itself
    through the proxy its request names."""
    loop = LoopThread()
    leases = LeasePool(
        w.server.url,
        holder="scrapy",
        http=w.client(),
        sleep=w.clock.sleep,
        clock=w.clock,
        idle=None,
        ttl=TTL,
        wait=0.0,
        token="",
    )
    middleware = DiscoveryProxyMiddleware(
        get_crawler(Spider), leases, BanPolicy(), ban_retries=5, error_exceptions=()
    )

    async def get(path: str) -> str:
        request = Request(f"http://shop.example{path}")
        await middleware.process_request(request)
        through = proxy(request.meta["proxy"])
        async with httpx.AsyncClient(transport=through) as direct:
            answer = await direct.get(request.url)
        response = Response(request.url, status=answer.status_code, body=answer.content)
        got = await middleware.process_response(request, response)
        assert isinstance(got, Response)
        return got.body.decode()

    try:
        yield lambda path: loop.run(get(path))
        loop.run(leases.aclose())
    finally:
        loop.stop()
