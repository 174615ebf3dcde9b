"""httpx transports that send every request through a proxy leased for its site.

    import httpx
    from egress_proxies_client import AsyncDiscoveryTransport, DiscoveryTransport

    async with httpx.AsyncClient(transport=AsyncDiscoveryTransport(URL)) as client:
        await client.get("https://shop.example/a")   # through a proxy leased for shop.example

    with httpx.Client(transport=DiscoveryTransport(URL)) as client: ...

Per site (the request's host name) the transport holds up to `per_site`
leases, each leased for that site. An answer the ban policy calls a ban
(403, 429, 503 or `ban_body` by default) is reported `blocked` for the site,
the proxy dropped for it, and the request sent again through another proxy
(up to `ban_retries` times; then the last banned answer is returned); a 407
(the proxy refused its credentials) is reported `error` and retried the
same way (_rotation.py, shared with the Scrapy middleware). An error of
the proxy itself (no connection to it, a CONNECT refused with 407) is
reported `error`, the proxy dropped, and the error raised; an error past the
proxy (the site's TLS, a CONNECT the proxy answered with another status,
no answer in time: `_bans.proxy_failed`) is raised, counted in
`errors/site`, and the lease kept. Closing the client (or the transport) releases every lease. `stats`
counts what happened. The options' defaults: _options.py.

The sync transport is the async one run on an event loop in a daemon thread
of its own (one implementation); it may be shared by threads, like an
httpx.Client. Both take `proxy_transport(url)`, which builds the (async)
transport to one proxy: `httpx.AsyncHTTPTransport(proxy=url)` by default;
give your own for `verify`, `http2`, limits, retries.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Unpack

import httpx

from egress_proxies_client._bans import (
    PROXY_AUTH_REQUIRED,
    BanDetector,
    BanPolicy,
    default_holder,
    needs_body,
    proxy_failed,
    site_of,
)
from egress_proxies_client._leasing import SYSTEM_CLOCK, Clock, Sleep
from egress_proxies_client._loop import LoopThread
from egress_proxies_client._options import Options, PoolSettings
from egress_proxies_client._pool import Held, LeasePool
from egress_proxies_client._rotation import Rotation

ProxyTransport = Callable[[str], httpx.AsyncBaseTransport]


class RotationOptions(PoolSettings, total=False):
    """The pool's options (`token`, `provider`, `zone`, `labels`, `ttl`,
    `per_site`, `wait`, `idle`) and the transport's own; defaults: Options."""

    holder: str | None  # default `httpx@HOST:PID`
    policy: BanDetector | None  # default BanPolicy()
    ban_body: str | bytes | None  # or: BanPolicy(body_pattern=...)
    ban_retries: int  # sends of one request through other proxies after bans
    proxy_transport: ProxyTransport | None
    http: httpx.AsyncClient | None  # to the discovery service (tests: ASGITransport)
    sleep: Sleep  # how the pool waits (default asyncio.sleep; tests: their own time)
    clock: Clock  # where the pool reads the time (default the `time` module)


@dataclass
class _Route:
    """The transport through one leased proxy."""

    url: str
    transport: httpx.AsyncBaseTransport
    in_flight: int = 0
    dropped: bool = False


class _Replay(httpx.AsyncByteStream):
    """A body read already (for the ban check), handed on as a stream not yet
    read, so the client reads (and times) it as any other."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._raw


class _Tracked(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close: Callable[[], None] | None = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()


class AsyncDiscoveryTransport(httpx.AsyncBaseTransport):
    """For `httpx.AsyncClient(transport=...)`; see the module's doc (use it on
    one event loop)."""

    def __init__(self, discovery_url: str, **options: Unpack[RotationOptions]) -> None:
        policy, ban_body = options.get("policy"), options.get("ban_body")
        if policy is not None and ban_body is not None:
            raise ValueError("give either policy or ban_body (a BanPolicy's body pattern)")
        self.policy: BanDetector = policy or BanPolicy(body_pattern=ban_body)
        chosen = Options.of(options)
        self.stats: Counter[str] = Counter()
        self._make: ProxyTransport = options.get("proxy_transport") or (
            lambda url: httpx.AsyncHTTPTransport(proxy=url)
        )
        self.pool = LeasePool(
            discovery_url,
            holder=options.get("holder") or default_holder("httpx"),
            count=self._count,
            on_drop=self._dropped,
            http=options.get("http"),
            sleep=options.get("sleep", asyncio.sleep),
            clock=options.get("clock", SYSTEM_CLOCK),
            **chosen.pool_settings(),
        )
        self._rotation = Rotation(
            self.pool, self.policy, ban_retries=chosen.ban_retries, count=self._count
        )
        self._routes: dict[str, _Route] = {}
        self._stale: list[httpx.AsyncBaseTransport] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        site = site_of(request.url)
        await request.aread()  # sent again after a ban
        tries = 0
        while True:
            held = await self.pool.acquire(site)
            route = self._route(held)
            finish = self._finisher(held, route)
            self._count("requests")
            try:
                response = await route.transport.handle_async_request(request)
            except httpx.TransportError as error:
                finish()
                if proxy_failed(error):
                    await self.pool.failed(held)
                else:
                    self._count("errors/site")  # past the proxy: the lease stays
                await self._close_stale()
                raise
            stream = response.stream
            assert isinstance(stream, httpx.AsyncByteStream)
            raw: bytes | None = None
            if response.status_code != PROXY_AUTH_REQUIRED and needs_body(self.policy):
                try:
                    raw = b"".join([chunk async for chunk in response.aiter_raw()])
                finally:
                    await response.aclose()
                    finish()
                response = _fresh(response, request, _Replay(raw))
            else:
                response.stream = _Tracked(stream, finish)
            outcome = await self._rotation.settle(
                held, response.status_code, response.headers, _decoded(response, raw)
            )
            if outcome == "ok":
                await self._close_stale()
                return response
            if not self._rotation.again(tries):
                return response
            tries += 1
            await response.aclose()
            await self._close_stale()

    async def aclose(self) -> None:
        await self.pool.aclose()
        routes, self._routes = list(self._routes.values()), {}
        for route in routes:
            await route.transport.aclose()
        await self._close_stale()

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] += n

    @property
    def ban_retries(self) -> int:
        return self._rotation.ban_retries

    def _route(self, held: Held) -> _Route:
        route = self._routes.get(held.id)
        if route is not None and route.url != held.url:  # the proxy moved (a renewal said)
            route.dropped = True
            if route.in_flight == 0:
                self._stale.append(route.transport)
            route = None
        if route is None:
            route = _Route(held.url, self._make(held.url))
            self._routes[held.id] = route
        route.in_flight += 1
        return route

    def _finisher(self, held: Held, route: _Route) -> Callable[[], None]:
        done = False

        def finish() -> None:
            nonlocal done
            if done:
                return
            done = True
            route.in_flight -= 1
            if route.dropped and route.in_flight == 0:
                self._stale.append(route.transport)
            self.pool.done(held)

        return finish

    def _dropped(self, held: Held) -> None:
        route = self._routes.pop(held.id, None)
        if route is None:
            return
        route.dropped = True
        if route.in_flight == 0:
            self._stale.append(route.transport)

    async def _close_stale(self) -> None:
        stale, self._stale = self._stale, []
        for transport in stale:
            await transport.aclose()


class DiscoveryTransport(httpx.BaseTransport):
    """For `httpx.Client(transport=...)`: AsyncDiscoveryTransport run on an
    event loop in a thread of its own; see the module's doc."""

    def __init__(self, discovery_url: str, **options: Unpack[RotationOptions]) -> None:
        self._loop: LoopThread | None = LoopThread(name="discovery-leases")
        self._inner = AsyncDiscoveryTransport(discovery_url, **options)

    @property
    def stats(self) -> Counter[str]:
        return self._inner.stats

    @property
    def pool(self) -> LeasePool:
        return self._inner.pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        loop = self._running()
        request.read()  # a ByteStream now: readable from the loop's side too
        response = loop.run(self._inner.handle_async_request(request))
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        return _fresh(response, request, _SyncStream(stream, loop))

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run(self._inner.aclose())
        finally:
            loop.stop()

    def _running(self) -> LoopThread:
        if self._loop is None:
            raise RuntimeError("the transport is closed")
        return self._loop


class _SyncStream(httpx.SyncByteStream):
    """An answer's async stream, read chunk by chunk on the transport's loop."""

    def __init__(self, inner: httpx.AsyncByteStream, loop: LoopThread) -> None:
        self._inner = inner
        self._loop = loop

    def __iter__(self) -> Iterator[bytes]:
        chunks = aiter(self._inner)
        while True:
            try:
                yield self._loop.run(_next(chunks))
            except StopAsyncIteration:
                return

    def close(self) -> None:
        self._loop.run(self._inner.aclose())


async def _next(chunks: AsyncIterator[bytes]) -> bytes:
    return await anext(chunks)


def _decoded(response: httpx.Response, raw: bytes | None) -> bytes:
    """The body as the client will see it (gzip, br, ... undone); b"" unread."""
    if raw is None:
        return b""
    return httpx.Response(
        response.status_code, headers=response.headers, stream=httpx.ByteStream(raw)
    ).read()


def _fresh(
    response: httpx.Response,
    request: httpx.Request,
    stream: httpx.SyncByteStream | httpx.AsyncByteStream,
) -> httpx.Response:
    return httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=stream,
        extensions=response.extensions,
        request=request,
    )
