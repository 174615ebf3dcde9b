"""One lease for the length of a block, async (`alease`) and sync (`lease`).

    async with alease(URL, holder="crawler-7", target="https://shop.example/") as proxy:
        answer = await client.get("https://shop.example/", proxy=proxy.url)   # your client
        if answer.status_code == 403:
            await proxy.report("blocked")     # this proxy cools down for shop.example

    with lease(URL, holder="crawler-7", target="https://shop.example/") as proxy:
        ...                                   # the same, for threads: proxy.report("blocked")

While nothing is free (409) or the service cannot be reached it asks again
(after what Retry-After says), up to `wait` seconds; it renews the lease in
the background; it releases it when the block ends, also on an exception.
Both run the pool's own loops (_leasing.py). The token defaults to
$DISCOVERY_TOKEN. `lease()` is `alease()` run on an event loop in a thread
of its own: one implementation. Both take `sleep` and `clock` (the time
they wait out and read: _leasing.py's seams for tests) and `http` (an
httpx.AsyncClient to the service, used on the loop that runs the lease).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

import httpx

from egress_proxies_client._api import LeaseApi
from egress_proxies_client._errors import DiscoveryError
from egress_proxies_client._leasing import SYSTEM_CLOCK, Clock, Sleep, ask, keep, within
from egress_proxies_client._loop import LoopThread
from egress_proxies_client._options import BLOCK_WAIT, Options
from egress_proxies_client._protocol import Granted, Outcome, grant_body


class LeaseOptions(TypedDict, total=False):
    target: str | None  # a URL or host name: the lease is for that site
    ttl: float | None  # seconds; the service's maximum when not given
    provider: str | None
    zone: str | None
    labels: Mapping[str, str] | None
    token: str | None  # default $DISCOVERY_TOKEN
    wait: float  # how long to wait while nothing is free (default BLOCK_WAIT, 300 s)
    renew: bool  # renew in the background (default True)


@dataclass
class AsyncLease:
    """A granted lease. `url` carries the proxy's credentials: do not log it."""

    id: str
    holder: str
    name: str
    url: str = field(repr=False)
    expires_at: datetime
    target: str | None
    _api: LeaseApi = field(repr=False)
    lost: bool = False  # the service said the lease is gone (expired, proxy left the fleet)
    _clock: Clock = field(default=SYSTEM_CLOCK, repr=False)

    async def report(self, outcome: Outcome, target: str | None = None) -> None:
        """Tells the service how the proxy did; `target` defaults to the lease's."""
        await self._api.report(self.id, outcome, target or self.target)

    async def renew(self, ttl: float | None = None) -> None:
        renewed = await self._api.renew(self.id, ttl)
        if renewed is None:
            self.lost = True
            raise DiscoveryError(404, "lease_not_found", "the lease has ended")
        self.refresh(renewed)

    def refresh(self, renewed: Granted) -> None:
        """Takes a grant's or renewal's end and proxy URL (the proxy may have moved)."""
        self.url = renewed.url
        self.expires_at = datetime.fromtimestamp(renewed.expires_at, UTC)

    def seconds_left(self) -> float:
        return self.expires_at.timestamp() - self._clock.time()


@asynccontextmanager
async def alease(
    base_url: str,
    holder: str,
    *,
    http: httpx.AsyncClient | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = SYSTEM_CLOCK,
    **options: Unpack[LeaseOptions],
) -> AsyncIterator[AsyncLease]:
    """Holds a lease for the `async with` block (see the module's doc)."""
    given = Options.of({"wait": BLOCK_WAIT, **options})
    api = LeaseApi(base_url, token=given.token, http=http)
    target = options.get("target")
    try:
        body = grant_body(holder, target=target, ttl=given.ttl, chosen=given.selector())
        what = f"for {target}" if target else f"for {holder}"
        got = await within(given.wait, sleep, what, lambda: ask(api, body, clock), clock)
        when = datetime.fromtimestamp(got.expires_at, UTC)
        handle = AsyncLease(got.id, got.holder, got.name, got.url, when, target, api, _clock=clock)
        renewer = None
        if options.get("renew", True):
            renewer = asyncio.get_running_loop().create_task(_renew(handle, sleep, clock))
        try:
            yield handle
        except BaseException:
            # The block's own exception is what the caller must see, not a failed release.
            await _release(handle, renewer, quiet=True)
            raise
        await _release(handle, renewer, quiet=False)
    finally:
        await api.aclose()


async def _renew(handle: AsyncLease, sleep: Sleep, clock: Clock) -> None:
    if await keep(handle._api, handle, sleep, clock=clock) == "lost":
        handle.lost = True


async def _release(handle: AsyncLease, renewer: asyncio.Task[None] | None, *, quiet: bool) -> None:
    if renewer is not None:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
    try:
        await handle._api.release(handle.id)
    except (DiscoveryError, httpx.HTTPError):
        if not quiet:
            raise


class Lease:
    """`AsyncLease` for threads: the same lease, its calls run on `lease()`'s loop."""

    # The handle's fields, read through (typed here for the caller's checker).
    id: str
    holder: str
    name: str  # the proxy's
    url: str  # http://user:pass@host:port: do not log it
    expires_at: datetime
    target: str | None
    lost: bool

    def __init__(self, handle: AsyncLease, loop: LoopThread) -> None:
        self._handle = handle
        self._loop = loop

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._handle, attribute)

    def __repr__(self) -> str:
        return repr(self._handle)

    def report(self, outcome: Outcome, target: str | None = None) -> None:
        self._loop.run(self._handle.report(outcome, target))

    def renew(self, ttl: float | None = None) -> None:
        self._loop.run(self._handle.renew(ttl))


@contextmanager
def lease(
    base_url: str,
    holder: str,
    *,
    http: httpx.AsyncClient | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = SYSTEM_CLOCK,
    **options: Unpack[LeaseOptions],
) -> Iterator[Lease]:
    """`alease()` for threads (see the module's doc): `http` and `sleep` are
    used on the lease's own loop."""
    loop = LoopThread(name=f"lease-{holder}"[:15])
    try:
        manager = alease(base_url, holder, http=http, sleep=sleep, clock=clock, **options)
        handle = loop.run(manager.__aenter__())
        try:
            yield Lease(handle, loop)
        except BaseException as exc:
            loop.run(manager.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        loop.run(manager.__aexit__(None, None, None))
    finally:
        loop.stop()
