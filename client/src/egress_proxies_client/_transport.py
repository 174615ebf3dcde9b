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
(up to `ban_retries` times; then the last banned answer is returned). A
connection error through a proxy is reported `error`, the proxy dropped,
and the error raised. Closing the client (or the transport) releases every
lease. `stats` counts what happened.

The sync transport is the async one run on an event loop in a daemon thread
of its own (one implementation); it may be shared by threads, like an
httpx.Client. Both take `proxy_transport(url)`, which builds the (async)
transport to one proxy: `httpx.AsyncHTTPTransport(proxy=url)` by default;
give your own for `verify`, `http2`, limits, retries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypedDict, Unpack

import httpx

from egress_proxies_client._bans import (
    PROXY_AUTH_REQUIRED,
    BanDetector,
    BanPolicy,
    default_holder,
    needs_body,
    site_of,
)
from egress_proxies_client._loop import LoopThread
from egress_proxies_client._pool import Held, LeasePool

ProxyTransport = Callable[[str], httpx.AsyncBaseTransport]


class RotationOptions(TypedDict, total=False):
    holder: str | None  # default `httpx@HOST:PID`
    token: str | None  # default $DISCOVERY_TOKEN
    provider: str | None
    zone: str | None
    labels: Mapping[str, str] | None
    ttl: float | None
    per_site: int  # leases per site (default 1)
    wait: float  # how long a request waits for a proxy (default 60 s)
    idle: float | None  # give a lease back after so long unused (default 60 s)
    policy: BanDetector | None  # default BanPolicy()
    ban_body: str | bytes | None  # or: BanPolicy(body_pattern=...)
    ban_retries: int  # tries on other proxies after a ban (default 5)
    proxy_transport: ProxyTransport | None
    http: httpx.AsyncClient | None  # to the discovery service (tests: ASGITransport)


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
        self.ban_retries = options.get("ban_retries", 5)
        self.stats: Counter[str] = Counter()
        self._make: ProxyTransport = options.get("proxy_transport") or (
            lambda url: httpx.AsyncHTTPTransport(proxy=url)
        )
        self.pool = LeasePool(
            discovery_url,
            holder=options.get("holder") or default_holder("httpx"),
            token=options.get("token"),
            provider=options.get("provider"),
            zone=options.get("zone"),
            labels=options.get("labels"),
            ttl=options.get("ttl"),
            per_site=options.get("per_site", 1),
            wait=options.get("wait", 60.0),
            idle=options.get("idle", 60.0),
            count=self._count,
            on_drop=self._dropped,
            http=options.get("http"),
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
            except httpx.TransportError:
                finish()
                await self.pool.failed(held)
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
            outcome = self._verdict(response.status_code, response.headers, raw)
            if outcome is None:
                await self._close_stale()
                return response
            await (self.pool.blocked if outcome == "blocked" else self.pool.failed)(held)
            if self._give_up_retrying(tries):
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

    def _verdict(self, status: int, headers: httpx.Headers, raw: bytes | None) -> str | None:
        """`blocked`, `error` (the proxy refused its credentials) or None (a good answer)."""
        if status == PROXY_AUTH_REQUIRED:
            return "error"
        body = b""
        if raw is not None:
            # Decoded as the client would (gzip, br, ...).
            body = httpx.Response(status, headers=headers, stream=httpx.ByteStream(raw)).read()
        if self.policy.is_ban(status, headers, body):
            self._count("bans")
            return "blocked"
        return None

    def _give_up_retrying(self, tries: int) -> bool:
        if tries >= self.ban_retries:
            self._count("retries/exhausted")
            return True
        self._count("retries")
        return False

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
