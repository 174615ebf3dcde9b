"""httpx transports that send every request through a proxy leased for its site.

    import httpx
    from discovery.httpx import DiscoveryTransport

    with httpx.Client(transport=DiscoveryTransport("http://10.0.0.2:8080")) as client:
        client.get("https://shop.example/a")      # through a proxy leased for shop.example

    async with httpx.AsyncClient(transport=AsyncDiscoveryTransport(URL)) as client: ...

Per site (the request's host name) the transport holds up to `per_site`
leases, each leased for that site. An answer the ban policy calls a ban
(403, 429, 503 or `ban_body` by default) is reported `blocked` for the site,
the proxy dropped for it, and the request sent again through another proxy
(up to `ban_retries` times; then the last banned answer is returned). A
connection error through a proxy is reported `error`, the proxy dropped,
and the error raised. Closing the client (or the transport) releases every
lease. `stats` counts what happened (docs/crawlers.md).

The sync transport runs the lease pool on an event loop in a (daemon) thread
of its own; it may be shared by threads, like an httpx.Client.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from discovery.rotation import (
    PROXY_AUTH_REQUIRED,
    BanDetector,
    BanPolicy,
    Held,
    LeasePool,
    default_holder,
    needs_body,
    site_of,
)

T = TypeVar("T", httpx.BaseTransport, httpx.AsyncBaseTransport)
R = TypeVar("R")


class _LoopThread:
    """An asyncio event loop in a daemon thread (a forgotten close() never keeps
    the process from exiting: its leases then end at their TTL)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="discovery-leases")
        self.thread.daemon = True
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def call(self, function: Callable[..., R], *args: Any) -> R:
        async def call() -> R:
            return function(*args)

        return self.run(call())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


@dataclass
class _Route(Generic[T]):
    """The transport through one leased proxy."""

    url: str
    transport: T
    in_flight: int = 0
    dropped: bool = False


class _Rotation:
    """What both transports share: options, stats, the ban verdict."""

    def __init__(
        self,
        discovery_url: str,
        *,
        holder: str | None,
        token: str | None,
        provider: str | None,
        zone: str | None,
        labels: Mapping[str, str] | None,
        ttl: float | None,
        per_site: int,
        wait: float,
        idle: float | None,
        policy: BanDetector | None,
        ban_body: str | bytes | None,
        ban_retries: int,
    ) -> None:
        if policy is not None and ban_body is not None:
            raise ValueError("give either policy or ban_body (a BanPolicy's body pattern)")
        self.policy: BanDetector = policy or BanPolicy(body_pattern=ban_body)
        self.ban_retries = ban_retries
        self.stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()
        self.pool = LeasePool(
            discovery_url,
            holder=holder or default_holder("httpx"),
            token=token,
            provider=provider,
            zone=zone,
            labels=labels,
            ttl=ttl,
            per_site=per_site,
            wait=wait,
            idle=idle,
            count=self._count,
            on_drop=self._dropped,
        )

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    def _dropped(self, held: Held) -> None:
        raise NotImplementedError

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


class _Replay(httpx.SyncByteStream):
    """A body read already (for the ban check), handed on as a stream not yet read,
    so the client reads (and times) it as any other."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def __iter__(self) -> Iterator[bytes]:
        yield self._raw


class _Tracked(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close: Callable[[], None] | None = on_close

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()


class _AsyncReplay(httpx.AsyncByteStream):
    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._raw


class _AsyncTracked(httpx.AsyncByteStream):
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


def _fresh(response: httpx.Response, request: httpx.Request, stream: Any) -> httpx.Response:
    return httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=stream,
        extensions=response.extensions,
        request=request,
    )


class DiscoveryTransport(_Rotation, httpx.BaseTransport):
    """For `httpx.Client(transport=...)`; see the module's doc.

    `proxy_transport(url)` builds the transport for one proxy (default
    `httpx.HTTPTransport(proxy=url)`; give your own for `verify`, `http2`,
    limits, retries).
    """

    def __init__(
        self,
        discovery_url: str,
        *,
        holder: str | None = None,
        token: str | None = None,
        provider: str | None = None,
        zone: str | None = None,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        per_site: int = 1,
        wait: float = 60.0,
        idle: float | None = 60.0,
        policy: BanDetector | None = None,
        ban_body: str | bytes | None = None,
        ban_retries: int = 5,
        proxy_transport: Callable[[str], httpx.BaseTransport] | None = None,
    ) -> None:
        super().__init__(
            discovery_url,
            holder=holder,
            token=token,
            provider=provider,
            zone=zone,
            labels=labels,
            ttl=ttl,
            per_site=per_site,
            wait=wait,
            idle=idle,
            policy=policy,
            ban_body=ban_body,
            ban_retries=ban_retries,
        )
        self._make = proxy_transport or (lambda url: httpx.HTTPTransport(proxy=url))
        self._routes: dict[str, _Route[httpx.BaseTransport]] = {}
        self._lock = threading.Lock()
        self._thread: _LoopThread | None = _LoopThread()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        site = site_of(request.url)
        request.read()  # sent again after a ban
        tries = 0
        while True:
            held = self._loop().run(self.pool.acquire(site))
            route = self._route(held)
            finish = self._finisher(held, route)
            self._count("requests")
            try:
                response = route.transport.handle_request(request)
            except httpx.TransportError:
                finish()
                self._loop().run(self.pool.failed(held))
                raise
            stream = response.stream
            assert isinstance(stream, httpx.SyncByteStream)
            raw: bytes | None = None
            if response.status_code != PROXY_AUTH_REQUIRED and needs_body(self.policy):
                try:
                    raw = b"".join(response.iter_raw())
                finally:
                    response.close()
                    finish()
                response = _fresh(response, request, _Replay(raw or b""))
            else:
                response.stream = _Tracked(stream, finish)
            outcome = self._verdict(response.status_code, response.headers, raw)
            if outcome is None:
                return response
            give_up = self.pool.blocked if outcome == "blocked" else self.pool.failed
            self._loop().run(give_up(held))
            if self._give_up_retrying(tries):
                return response
            tries += 1
            response.close()

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.run(self.pool.aclose())
        finally:
            thread.stop()
            with self._lock:
                routes, self._routes = list(self._routes.values()), {}
            for route in routes:
                route.transport.close()

    def _loop(self) -> _LoopThread:
        thread = self._thread
        if thread is None:
            raise RuntimeError("the transport is closed")
        return thread

    def _route(self, held: Held) -> _Route[httpx.BaseTransport]:
        moved: _Route[httpx.BaseTransport] | None = None
        with self._lock:
            route = self._routes.get(held.id)
            if route is not None and route.url != held.url:  # the proxy moved (a renewal said)
                route.dropped = True
                moved = route if route.in_flight == 0 else None
                route = None
            if route is None:
                route = _Route(held.url, self._make(held.url))
                self._routes[held.id] = route
            route.in_flight += 1
        if moved is not None:
            moved.transport.close()
        return route

    def _finisher(self, held: Held, route: _Route[httpx.BaseTransport]) -> Callable[[], None]:
        done = threading.Event()

        def finish() -> None:
            if done.is_set():
                return
            done.set()
            with self._lock:
                route.in_flight -= 1
                stale = route.dropped and route.in_flight == 0
            if stale:
                route.transport.close()
            thread = self._thread
            if thread is not None:
                thread.call(self.pool.done, held)

        return finish

    def _dropped(self, held: Held) -> None:
        # On the pool's loop: close the proxy's transport once no request uses it.
        with self._lock:
            route = self._routes.pop(held.id, None)
            if route is None:
                return
            route.dropped = True
            idle = route.in_flight == 0
        if idle:
            route.transport.close()


class AsyncDiscoveryTransport(_Rotation, httpx.AsyncBaseTransport):
    """For `httpx.AsyncClient(transport=...)`: DiscoveryTransport for asyncio (use it
    on one event loop)."""

    def __init__(
        self,
        discovery_url: str,
        *,
        holder: str | None = None,
        token: str | None = None,
        provider: str | None = None,
        zone: str | None = None,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        per_site: int = 1,
        wait: float = 60.0,
        idle: float | None = 60.0,
        policy: BanDetector | None = None,
        ban_body: str | bytes | None = None,
        ban_retries: int = 5,
        proxy_transport: Callable[[str], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        super().__init__(
            discovery_url,
            holder=holder,
            token=token,
            provider=provider,
            zone=zone,
            labels=labels,
            ttl=ttl,
            per_site=per_site,
            wait=wait,
            idle=idle,
            policy=policy,
            ban_body=ban_body,
            ban_retries=ban_retries,
        )
        self._make = proxy_transport or (lambda url: httpx.AsyncHTTPTransport(proxy=url))
        self._routes: dict[str, _Route[httpx.AsyncBaseTransport]] = {}
        self._stale: list[httpx.AsyncBaseTransport] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        site = site_of(request.url)
        await request.aread()
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
            astream = response.stream
            assert isinstance(astream, httpx.AsyncByteStream)
            raw: bytes | None = None
            if response.status_code != PROXY_AUTH_REQUIRED and needs_body(self.policy):
                try:
                    raw = b"".join([chunk async for chunk in response.aiter_raw()])
                finally:
                    await response.aclose()
                    finish()
                response = _fresh(response, request, _AsyncReplay(raw or b""))
            else:
                response.stream = _AsyncTracked(astream, finish)
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

    def _route(self, held: Held) -> _Route[httpx.AsyncBaseTransport]:
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

    def _finisher(self, held: Held, route: _Route[httpx.AsyncBaseTransport]) -> Callable[[], None]:
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
