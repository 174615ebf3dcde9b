"""Proxies per site for crawlers: leases held per target host, rotated on bans.

The part that the Scrapy middleware (`discovery.scrapy`) and the httpx
transports (`discovery.httpx`) share; it imports neither Scrapy nor Twisted.

- :class:`BanPolicy` decides whether an answer means "this site banned this
  proxy": by default a 403, 429 or 503, or a body matching a pattern.
- :class:`LeasePool` (asyncio) holds up to `per_site` leases for each site
  (a target's host name), each leased *for that site*, so the service skips
  proxies cooling down for it. A banned proxy is reported `blocked` for the
  site and released (the service then rests it for that site); a proxy that
  failed (connection refused, reset, timeout) is reported `error` and
  released. Leases are renewed in the background at a third of their time,
  given back after `idle` seconds unused, and all released by `aclose()`.
  While nothing is free it waits what the service's Retry-After says, up to
  `wait` seconds, then raises `discovery.client.NoProxyAvailable`: a request
  never goes out without a proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from discovery.client import DiscoveryError, NoProxyAvailable, Outcome, _raise_for

logger = logging.getLogger("discovery.rotation")

DEFAULT_BAN_STATUSES: tuple[int, ...] = (403, 429, 503)
# The proxy refused our credentials: the proxy's fault, not the site's.
PROXY_AUTH_REQUIRED = 407
_TIMEOUT = httpx.Timeout(10.0)
# Pause after the service could not be reached before asking again.
_UNREACHABLE_PAUSE = 1.0


# -- ban detection ---------------------------------------------------------------------------


class BanDetector(Protocol):
    """What a replacement policy must provide."""

    def is_ban(self, status: int, headers: Mapping[str, str], body: bytes) -> bool:
        """True when this answer means the site refuses this proxy."""
        ...


class BanPolicy:
    """The default ban detection: some statuses, or a body that matches a pattern.

    `headers` are the answer's headers with case-insensitive str keys (a
    subclass may look at them, e.g. `cf-mitigated`). `needs_body` tells the
    httpx transports to read the whole body before deciding (Scrapy always
    has it); a subclass that looks at the body sets it.
    """

    def __init__(
        self,
        statuses: Iterable[int] = DEFAULT_BAN_STATUSES,
        body_pattern: str | bytes | re.Pattern[bytes] | None = None,
    ) -> None:
        self.statuses = frozenset(int(s) for s in statuses)
        if isinstance(body_pattern, str):
            body_pattern = body_pattern.encode()
        if isinstance(body_pattern, bytes):
            body_pattern = re.compile(body_pattern) if body_pattern else None
        self.body_pattern: re.Pattern[bytes] | None = body_pattern

    @property
    def needs_body(self) -> bool:
        return self.body_pattern is not None

    def is_ban(self, status: int, headers: Mapping[str, str], body: bytes) -> bool:
        if status in self.statuses:
            return True
        return self.body_pattern is not None and self.body_pattern.search(body) is not None

    def __repr__(self) -> str:
        pattern = self.body_pattern.pattern if self.body_pattern is not None else None
        return f"BanPolicy(statuses={sorted(self.statuses)}, body_pattern={pattern!r})"


def needs_body(policy: BanDetector) -> bool:
    """Whether `policy` looks at bodies (a policy that does not say is assumed to)."""
    return bool(getattr(policy, "needs_body", True))


# -- sites -----------------------------------------------------------------------------------


def site_of(url: str | httpx.URL) -> str:
    """The site a URL belongs to: its host name, lower-cased (IPv6 without brackets).
    Leases, cooldowns and bans are per site."""
    host = url.host if isinstance(url, httpx.URL) else urlsplit(url).hostname
    if not host:
        raise ValueError(f"{str(url)!r} has no host name: no site to lease a proxy for")
    return host.lower().rstrip(".")


def _target(site: str) -> str:
    # The service takes a URL or a host name; an IPv6 literal needs its brackets.
    return f"[{site}]" if ":" in site else site


def default_holder(kind: str) -> str:
    """`kind@host:pid`: who holds the leases, as the service's debug log shows it."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


# -- the pool --------------------------------------------------------------------------------


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


class PoolClosed(RuntimeError):
    """The pool was closed: no more leases."""


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
        self.selector: dict[str, Any] = {
            k: dict(v) if isinstance(v, Mapping) else v
            for k, v in (("provider", provider), ("zone", zone), ("labels", labels))
            if v is not None
        }
        self.ttl = ttl
        self.per_site = per_site
        self.wait = wait
        self.idle = idle
        self._count = count
        self._on_drop = on_drop
        self._http = http
        self._own_http = http is None
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
            if self._own_http and self._http is not None:
                await self._http.aclose()

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosed("the lease pool is closed")

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=_TIMEOUT
            )
        return self._http

    def _use(self, state: _Site) -> Held:
        held = min(state.leases, key=lambda h: (h.in_flight, h.uses))
        held.in_flight += 1
        held.uses += 1
        held.last_used = time.monotonic()
        return held

    async def _grant(self, site: str, state: _Site) -> Held | None:
        body: dict[str, Any] = {"holder": self.holder, "target": _target(site)}
        if self.ttl is not None:
            body["ttlSeconds"] = self.ttl
        if self.selector:
            body["selector"] = self.selector
        try:
            answer = await self._client().post("/v1/leases", json=body)
        except httpx.TransportError as exc:
            state.retry_after = _UNREACHABLE_PAUSE
            state.retry_at = time.monotonic() + _UNREACHABLE_PAUSE
            state.detail = f"the discovery service at {self.base_url} is unreachable ({exc!r})"
            logger.warning("%s", state.detail)
            return None
        if answer.status_code == 409:
            try:
                retry_after = max(0.1, float(answer.headers.get("retry-after", "1")))
            except ValueError:
                retry_after = 1.0
            detail = ""
            with contextlib.suppress(ValueError):
                detail = str(answer.json().get("detail", ""))
            # A little jitter, so crawlers told the same Retry-After do not all come back at once.
            state.retry_after = retry_after
            state.retry_at = time.monotonic() + retry_after * (1 + 0.1 * random.random())
            state.detail = detail
            self._count("leases/denied", 1)
            logger.info("no proxy for %s now (%s); next try in %g s", site, detail, retry_after)
            return None
        _raise_for(answer)
        data = answer.json()
        now = time.time()
        expires = _epoch(data["expiresAt"])
        held = Held(
            id=data["id"],
            site=site,
            name=data["proxy"]["name"],
            url=data["proxy"]["url"],
            expires_at=expires,
            ttl=max(1.0, expires - now),
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
            answer = await self._client().post(f"/v1/leases/{held.id}/renew")
        except httpx.TransportError as exc:
            logger.warning("renewing the lease of %s failed (%r); trying again", held.name, exc)
            held.renewed_at = time.time() - held.ttl / 3 + min(held.ttl / 6, 5.0)
            return
        if answer.status_code == 404:
            self._forget(held)
            self._count("leases/lost", 1)
            logger.warning(
                "the lease of %s for %s ended (expired or revoked)", held.name, held.site
            )
            return
        try:
            _raise_for(answer)
        except DiscoveryError as exc:
            logger.warning("renewing the lease of %s failed (%s); trying again", held.name, exc)
            held.renewed_at = time.time() - held.ttl / 3 + min(held.ttl / 6, 5.0)
            return
        data = answer.json()
        held.url = data["proxy"]["url"]  # the proxy may have moved
        held.expires_at = _epoch(data["expiresAt"])
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
            answer = await self._client().post(
                f"/v1/leases/{held.id}/report",
                json={"outcome": outcome, "target": _target(held.site)},
            )
            if answer.status_code != 404:
                _raise_for(answer)
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
            answer = await self._client().delete(f"/v1/leases/{held.id}")
            if answer.status_code != 404:
                _raise_for(answer)
            self._count("leases/released", 1)
        except (DiscoveryError, httpx.TransportError) as exc:
            # The lease then ends at its expiry.
            logger.warning("releasing the lease of %s failed: %s", held.name, exc)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
