"""Proxies per site for crawlers: leases held per target host, rotated on bans.

What the Scrapy middleware (`egress_proxies_client.scrapy`) and the httpx
transports share; it imports neither Scrapy nor Twisted.

:class:`LeasePool` (asyncio) holds up to `per_site` leases for each site (a
target's host name), each leased *for that site*, so the service skips
proxies cooling down for it. A banned proxy is reported `blocked` for the
site and released (the service then rests it for that site); a proxy that
failed (connection refused, reset, timeout, 407) is reported `error` and
released. Leases are renewed in the background, given back after `idle`
seconds unused, and all released by `aclose()`. While nothing is free it
waits what the service's Retry-After says, up to `wait` seconds, then raises
NoProxyAvailable: a request never goes out without a proxy. Granting,
waiting and renewal are _leasing.py's loops, the ones `alease()` runs; the
options and their defaults are _options.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Unpack

import httpx

from egress_proxies_client._api import LeaseApi
from egress_proxies_client._bans import target_of
from egress_proxies_client._errors import DiscoveryError, NoProxyAvailable, PoolClosed
from egress_proxies_client._leasing import (
    NOT_REFUSED,
    SYSTEM_CLOCK,
    Clock,
    Refusal,
    Sleep,
    ask,
    keep,
    within,
)
from egress_proxies_client._options import Options, PoolSettings
from egress_proxies_client._protocol import Granted, Outcome, grant_body

logger = logging.getLogger("egress_proxies_client")


@dataclass(eq=False)
class Held:
    """One lease held for one site. `url` carries the proxy's credentials: never log it."""

    id: str
    site: str
    name: str
    url: str = field(repr=False)
    expires_at: float  # epoch seconds
    ttl: float  # as granted
    in_flight: int = 0
    uses: int = 0
    last_used: float = field(default_factory=time.monotonic)  # the clock's monotonic()
    dropped: bool = False
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False)

    def seconds_left(self) -> float:
        return self.expires_at - self.clock.time()

    def refresh(self, renewed: Granted) -> None:
        """Takes a renewal's end and proxy URL (the proxy may have moved: the
        next request goes to the new one)."""
        self.url = renewed.url
        self.expires_at = renewed.expires_at


@dataclass
class _Site:
    leases: list[Held] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    granting: bool = False
    refused: Refusal = NOT_REFUSED  # the last refusal: no new grant before its time


Counter = Callable[[str, int], None]


def _no_count(key: str, n: int) -> None:
    pass


class LeasePool:
    """Leases per site from the discovery service at `base_url` (see the module's doc).

    The options (`token`, `provider`, `zone`, `labels`, `ttl`, `per_site`,
    `wait`, `idle`) and their defaults are `Options`'. `count(key, n)`
    receives the events: `leases/granted`, `leases/denied` (409s),
    `leases/released`, `leases/lost` (the service ended one), `leases/idle`
    (given back unused), `reports/blocked`, `reports/error`, `no_proxy` (gave
    up waiting). Use from one asyncio event loop.
    """

    def __init__(
        self,
        base_url: str,
        *,
        holder: str,
        count: Counter = _no_count,
        on_drop: Callable[[Held], None] | None = None,
        http: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = SYSTEM_CLOCK,
        **settings: Unpack[PoolSettings],
    ) -> None:
        self.options = Options(**settings)
        self.base_url = base_url
        self.holder = holder
        self._count = count
        self._on_drop = on_drop
        self._api = LeaseApi(base_url, token=self.options.token, http=http)
        self._sleep = sleep
        self._clock = clock
        self._sites: dict[str, _Site] = {}
        self._by_id: dict[str, Held] = {}
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    # -- what the adapters call ----------------------------------------------------------

    async def acquire(self, site: str) -> Held:
        """A lease for `site` to send one request through (mark it `done()` after)."""
        state = self._sites.setdefault(site, _Site())
        try:
            return await within(
                self.options.wait,
                self._sleep,
                f"for {site}",
                lambda: self._step(site, state),
                self._clock,
            )
        except NoProxyAvailable:
            self._count("no_proxy", 1)
            raise

    def lookup(self, lease_id: str | None) -> Held | None:
        """The held lease with this id, or None once it was dropped."""
        return self._by_id.get(lease_id) if lease_id is not None else None

    def done(self, held: Held) -> None:
        """One request through `held` has ended."""
        held.in_flight = max(0, held.in_flight - 1)
        held.last_used = self._clock.monotonic()

    async def blocked(self, held: Held) -> bool:
        """The site banned this proxy: report `blocked` for the site, release, use
        another from now on. False when it was dropped already (by another request)."""
        return await self._give_up(held, "blocked")

    async def failed(self, held: Held) -> bool:
        """The proxy failed (connection error): report `error`, release."""
        return await self._give_up(held, "error")

    def leases(self) -> list[Held]:
        return list(self._by_id.values())

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Releases every lease (concurrently); afterwards acquire() raises PoolClosed."""
        if self._closed:
            return
        self._closed = True
        held = list(self._by_id.values())
        keepers = [t for t in self._keepers.values() if t is not asyncio.current_task()]
        for lease in held:
            self._forget(lease)
        try:
            await asyncio.gather(*keepers, return_exceptions=True)  # cancelled: let them end
            await asyncio.gather(*(self._release(lease) for lease in held))
        finally:
            await self._api.aclose()

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosed("the lease pool is closed")

    def _use(self, state: _Site) -> Held:
        held = min(state.leases, key=lambda h: (h.in_flight, h.uses))
        held.in_flight += 1
        held.uses += 1
        held.last_used = self._clock.monotonic()
        return held

    async def _step(self, site: str, state: _Site) -> Held | Refusal:
        """A lease of the site's to use, asking the service for one more while
        it has fewer than `per_site` (one grant at a time per site, none
        before the last refusal's time); else the refusal to wait out."""
        self._check_open()
        if state.leases and (
            state.granting
            or len(state.leases) >= self.options.per_site
            or self._clock.monotonic() < state.refused.at
        ):
            return self._use(state)
        async with state.lock:
            self._check_open()
            ready = self._clock.monotonic() >= state.refused.at
            if len(state.leases) < self.options.per_site and ready:
                state.granting = True
                try:
                    await self._grant(site, state)
                finally:
                    state.granting = False
            if state.leases:
                return self._use(state)
        return state.refused

    async def _grant(self, site: str, state: _Site) -> None:
        body = grant_body(
            self.holder,
            target=target_of(site),
            ttl=self.options.ttl,
            chosen=self.options.selector(),
        )
        got = await ask(self._api, body, self._clock)
        if isinstance(got, Refusal):
            state.refused = got
            if got.denied:
                self._count("leases/denied", 1)
                logger.info(
                    "no proxy for %s now (%s); next try in %g s", site, got.detail, got.retry_after
                )
            return
        held = Held(
            id=got.id,
            site=site,
            name=got.name,
            url=got.url,
            expires_at=got.expires_at,
            ttl=max(1.0, got.expires_at - self._clock.time()),
            last_used=self._clock.monotonic(),
            clock=self._clock,
        )
        self._count("leases/granted", 1)
        logger.info("leased proxy %s for %s (lease %s)", held.name, site, held.id)
        if self._closed:  # closed while the grant was under way
            await self._release(held)
            self._check_open()
        state.refused = NOT_REFUSED
        state.leases.append(held)
        self._by_id[held.id] = held
        self._keepers[held.id] = asyncio.get_running_loop().create_task(
            self._keep(held), name=f"lease-{held.id[:8]}"
        )

    async def _keep(self, held: Held) -> None:
        """Renews `held` (the one renew loop); gives it back when idle."""
        ending = await keep(
            self._api, held, self._sleep, clock=self._clock, idle_in=lambda: self._idle_in(held)
        )
        self._forget(held)
        if ending == "lost":
            self._count("leases/lost", 1)
            logger.warning(
                "the lease of %s for %s ended (expired or revoked)", held.name, held.site
            )
            return
        self._count("leases/idle", 1)
        unused = self._clock.monotonic() - held.last_used
        logger.info("giving back proxy %s (unused for %.0f s)", held.name, unused)
        await self._release(held)

    def _idle_in(self, held: Held) -> float | None:
        """Seconds until `held` counts as unused (None: never given back)."""
        idle = self.options.idle
        if idle is None:
            return None
        if held.in_flight:
            return idle  # looked at again then, at the latest
        return held.last_used + idle - self._clock.monotonic()

    async def _give_up(self, held: Held, outcome: Outcome) -> bool:
        if held.dropped:
            return False
        self._forget(held)
        self._count(f"reports/{outcome}", 1)
        if outcome == "blocked":
            logger.warning(
                "proxy %s is banned by %s: reported, using another", held.name, held.site
            )
        else:
            logger.warning("proxy %s failed for %s: reported, using another", held.name, held.site)
        try:
            await self._api.report(held.id, outcome, target_of(held.site))
        except (DiscoveryError, httpx.TransportError) as exc:
            logger.warning("reporting %s for %s failed: %s", outcome, held.name, exc)
        await self._release(held)
        return True

    def _forget(self, held: Held) -> None:
        """No request uses `held` from now on; its keeper stops."""
        if held.dropped:
            return
        held.dropped = True
        self._by_id.pop(held.id, None)
        state = self._sites.get(held.site)
        if state is not None and held in state.leases:
            state.leases.remove(held)
        keeper = self._keepers.pop(held.id, None)
        if keeper is not None and keeper is not asyncio.current_task():
            keeper.cancel()
        if self._on_drop is not None:
            self._on_drop(held)

    async def _release(self, held: Held) -> None:
        try:
            await self._api.release(held.id)
            self._count("leases/released", 1)
        except (DiscoveryError, httpx.TransportError) as exc:
            # The lease then ends at its expiry.
            logger.warning("releasing the lease of %s failed: %s", held.name, exc)
