"""Proxies per site for crawlers: leases held per target host, rotated on bans.

What the Scrapy middleware (`egress_proxies_client.scrapy`) and the httpx
transports share; it imports neither Scrapy nor Twisted.

:class:`LeasePool` (asyncio) holds up to `per_site` leases for each site (a
target's host name), each leased *for that site*, so the service skips
proxies cooling down for it. A banned proxy is reported `blocked` for the
site and released (the service then rests it for that site); a proxy that
failed (connection refused, reset, timeout) is reported `error` and
released. Leases are renewed in the background at a third of their time,
given back after `idle` seconds unused, and all released by `aclose()`.
While nothing is free it waits what the service's Retry-After says, up to
`wait` seconds, then raises NoProxyAvailable: a request never goes out
without a proxy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx

from egress_proxies_client._api import LeaseApi
from egress_proxies_client._bans import target_of
from egress_proxies_client._errors import DiscoveryError, NoProxyAvailable, PoolClosed
from egress_proxies_client._protocol import Denied, Outcome, grant_body, selector

logger = logging.getLogger("egress_proxies_client")

# Pause after the service could not be reached before asking again.
_UNREACHABLE_PAUSE = 1.0


@dataclass(eq=False)
class Held:
    """One lease held for one site. `url` carries the proxy's credentials: never log it."""

    id: str
    site: str
    name: str
    url: str = field(repr=False)
    expires_at: float  # epoch seconds
    ttl: float
    in_flight: int = 0
    uses: int = 0
    last_used: float = field(default_factory=time.monotonic)
    dropped: bool = False
    renewed_at: float = field(default_factory=time.time)


@dataclass
class _Site:
    leases: list[Held] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    granting: bool = False
    retry_at: float = 0.0  # monotonic: no new grant before this (the service said 409)
    retry_after: float = 0.0
    detail: str = ""


Counter = Callable[[str, int], None]


def _no_count(key: str, n: int) -> None:
    pass


class LeasePool:
    """Leases per site from the discovery service at `base_url` (see the module's doc).

    `count(key, n)` receives the events: `leases/granted`, `leases/denied`
    (409s), `leases/released`, `leases/lost` (the service ended one),
    `leases/idle` (given back unused), `reports/blocked`, `reports/error`,
    `no_proxy` (gave up waiting). Use from one asyncio event loop.
    """

    def __init__(
        self,
        base_url: str,
        *,
        holder: str,
        token: str | None = None,
        provider: str | None = None,
        zone: str | None = None,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        per_site: int = 1,
        wait: float = 60.0,
        idle: float | None = 60.0,
        count: Counter = _no_count,
        on_drop: Callable[[Held], None] | None = None,
        http: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if per_site < 1:
            raise ValueError(f"per_site must be at least 1, got {per_site}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        if wait < 0:
            raise ValueError(f"wait must not be negative, got {wait}")
        self.base_url = base_url
        self.holder = holder
        self.token = token if token is not None else os.environ.get("DISCOVERY_TOKEN")
        self.selector = selector(provider, zone, labels)
        self.ttl = ttl
        self.per_site = per_site
        self.wait = wait
        self.idle = idle
        self._count = count
        self._on_drop = on_drop
        self._api = LeaseApi(base_url, token=self.token, http=http)
        self._sleep = sleep
        self._sites: dict[str, _Site] = {}
        self._by_id: dict[str, Held] = {}
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    # -- what the adapters call ----------------------------------------------------------

    async def acquire(self, site: str) -> Held:
        """A lease for `site` to send one request through (mark it `done()` after)."""
        state = self._sites.setdefault(site, _Site())
        deadline = time.monotonic() + self.wait
        while True:
            self._check_open()
            if state.leases and (
                state.granting
                or len(state.leases) >= self.per_site
                or time.monotonic() < state.retry_at
            ):
                return self._use(state)
            async with state.lock:
                self._check_open()
                if len(state.leases) < self.per_site and time.monotonic() >= state.retry_at:
                    state.granting = True
                    try:
                        held = await self._grant(site, state)
                    finally:
                        state.granting = False
                    if held is not None:
                        if self._closed:  # closed while the grant was under way
                            await self._release(held)
                            self._check_open()
                        state.leases.append(held)
                        self._by_id[held.id] = held
                        self._keepers[held.id] = asyncio.get_running_loop().create_task(
                            self._keep(held), name=f"lease-{held.id[:8]}"
                        )
                if state.leases:
                    return self._use(state)
            left = deadline - time.monotonic()
            if left <= 0:
                self._count("no_proxy", 1)
                raise NoProxyAvailable(
                    f"no proxy for {site} after waiting {self.wait:g} s: {state.detail}",
                    state.retry_after,
                )
            await self._sleep(min(left, max(0.05, state.retry_at - time.monotonic())))

    def lookup(self, lease_id: str | None) -> Held | None:
        """The held lease with this id, or None once it was dropped."""
        return self._by_id.get(lease_id) if lease_id is not None else None

    def done(self, held: Held) -> None:
        """One request through `held` has ended."""
        held.in_flight = max(0, held.in_flight - 1)
        held.last_used = time.monotonic()

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
        held.last_used = time.monotonic()
        return held

    async def _grant(self, site: str, state: _Site) -> Held | None:
        body = grant_body(self.holder, target=target_of(site), ttl=self.ttl, chosen=self.selector)
        try:
            answer = await self._api.grant(body)
        except httpx.TransportError as exc:
            state.retry_after = _UNREACHABLE_PAUSE
            state.retry_at = time.monotonic() + _UNREACHABLE_PAUSE
            state.detail = f"the discovery service at {self.base_url} is unreachable ({exc!r})"
            logger.warning("%s", state.detail)
            return None
        if isinstance(answer, Denied):
            state.retry_after, state.detail = answer.retry_after, answer.detail
            state.retry_at = time.monotonic() + answer.pause()
            self._count("leases/denied", 1)
            logger.info(
                "no proxy for %s now (%s); next try in %g s",
                site,
                answer.detail,
                answer.retry_after,
            )
            return None
        held = Held(
            id=answer.id,
            site=site,
            name=answer.name,
            url=answer.url,
            expires_at=answer.expires_at,
            ttl=max(1.0, answer.expires_at - time.time()),
        )
        state.retry_at = 0.0
        self._count("leases/granted", 1)
        logger.info("leased proxy %s for %s (lease %s)", held.name, site, held.id)
        return held

    async def _keep(self, held: Held) -> None:
        """Renews `held` at a third of its time; gives it back when idle."""
        while not held.dropped:
            renew_at = held.renewed_at + held.ttl / 3
            wake = renew_at
            if self.idle is not None:
                wake = min(wake, time.time() + max(0.05, self.idle / 2))
            await self._sleep(max(0.05, wake - time.time()))
            if held.dropped:
                return
            idle_for = time.monotonic() - held.last_used
            if self.idle is not None and held.in_flight == 0 and idle_for >= self.idle:
                self._forget(held)
                self._count("leases/idle", 1)
                logger.info("giving back proxy %s (unused for %.0f s)", held.name, idle_for)
                await self._release(held)
                return
            if time.time() >= renew_at:
                await self._renew(held)

    async def _renew(self, held: Held) -> None:
        try:
            renewed = await self._api.renew(held.id)
        except (httpx.TransportError, DiscoveryError) as exc:
            logger.warning("renewing the lease of %s failed (%s); trying again", held.name, exc)
            held.renewed_at = time.time() - held.ttl / 3 + min(held.ttl / 6, 5.0)
            return
        if renewed is None:
            self._forget(held)
            self._count("leases/lost", 1)
            logger.warning(
                "the lease of %s for %s ended (expired or revoked)", held.name, held.site
            )
            return
        held.url = renewed.url  # the proxy may have moved
        held.expires_at = renewed.expires_at
        held.renewed_at = time.time()

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
