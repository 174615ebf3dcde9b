"""A Scrapy downloader middleware that sends every request through a leased proxy.

    DOWNLOADER_MIDDLEWARES = {"egress_proxies_client.scrapy.DiscoveryProxyMiddleware": 610}
    DISCOVERY_URL = "http://10.0.0.2:8080"          # the token: DISCOVERY_TOKEN or $DISCOVERY_TOKEN

For each request the middleware takes a lease *for the request's site* (its
host name) from the discovery service, so proxies cooling down for that site
are skipped, and sets `request.meta["proxy"]` to the proxy's URL with its
credentials (Scrapy's HttpProxyMiddleware, at 750, turns them into
Proxy-Authorization). A banned answer (by `DISCOVERY_BAN_POLICY`) makes it
report `blocked` for the site, drop that proxy for the site and send the
request again through another one, and so does a 407, reported `error`
(_rotation.py: the httpx transports' rule); an error of the proxy itself
(no connection to it, a CONNECT refused with 407) is reported as `error`,
and one past it (a timeout, the site's TLS) as nothing. Leases are renewed while in use and all released when the
spider closes. docs/crawlers.md has every setting; their defaults are
_options.py's.

Only this module of the package imports Scrapy (`pip install
egress-proxies-client[scrapy]`; import-linter holds the rest to that); it
needs Scrapy's asyncio reactor (its default).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from scrapy import signals
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Request, Response
from scrapy.utils.asyncio import is_asyncio_available
from scrapy.utils.misc import build_from_crawler, load_object

from egress_proxies_client._bans import (
    DEFAULT_BAN_STATUSES,
    PROXY_AUTH_REQUIRED,
    BanDetector,
    BanPolicy,
    default_holder,
    proxy_failed,
    site_of,
)
from egress_proxies_client._errors import DiscoveryError, PoolClosed
from egress_proxies_client._options import DEFAULTS, Options
from egress_proxies_client._pool import LeasePool
from egress_proxies_client._rotation import Rotation, reason

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger("egress_proxies_client.scrapy")

# request.meta keys
META_LEASE = "discovery_lease"  # the lease id the request went through (None while waiting)
META_PROXY = "discovery_proxy"  # the proxy's name, for your callbacks
META_BAN_RETRIES = "discovery_ban_retries"  # retries on another proxy after bans so far

# Exceptions of a download through a proxy that mean the proxy failed (reported
# `error`): no connection to it, or a CONNECT it refused with 407 (a
# TunnelError counts only then: another status is its word on the site). Not
# the timeouts and connections lost mid-answer: a dead or slow site causes
# them as well, and reports of them would take healthy proxies out
# (_bans.proxy_failed, which also decides first when the download handler
# is Scrapy's httpx one).
DEFAULT_ERROR_EXCEPTIONS = (
    "scrapy.exceptions.DownloadConnectionRefusedError",
    "scrapy.exceptions.CannotResolveHostError",
    "twisted.internet.error.ConnectError",
    "scrapy.core.downloader.handlers.http11.TunnelError",
)
_TUNNEL_STATUS = re.compile(r"'status': (\d+)")
# Answers of the service that no waiting will change: the crawl stops (429:
# the service brakes an address after wrong tokens).
_FATAL_STATUSES = frozenset({400, 401, 429})


def ban_policy(crawler: Crawler) -> BanDetector:
    """The policy `DISCOVERY_BAN_POLICY` names: an import path or a class (built with
    `from_crawler` when it has one; a BanPolicy subclass gets DISCOVERY_BAN_STATUSES
    and DISCOVERY_BAN_BODY), or an instance."""
    settings = crawler.settings
    spec = settings.get("DISCOVERY_BAN_POLICY") or BanPolicy
    loaded = load_object(spec) if isinstance(spec, str) else spec
    if isinstance(loaded, type):
        if hasattr(loaded, "from_crawler"):
            policy: Any = build_from_crawler(loaded, crawler)
        elif issubclass(loaded, BanPolicy):
            statuses = settings.getlist("DISCOVERY_BAN_STATUSES", list(DEFAULT_BAN_STATUSES))
            policy = loaded(
                statuses=[int(s) for s in statuses],
                body_pattern=settings.get("DISCOVERY_BAN_BODY") or None,
            )
        else:
            policy = loaded()
    else:
        policy = loaded
    if not callable(getattr(policy, "is_ban", None)):
        raise TypeError(f"DISCOVERY_BAN_POLICY {spec!r} has no is_ban(status, headers, body)")
    return policy  # type: ignore[no-any-return]


def _optional_float(
    settings: BaseSettings, name: str, default: float | None = None
) -> float | None:
    """A positive number of seconds, or None (unset, empty, or 0 and below)."""
    value = settings.get(name, default)
    if value is None or value == "":
        return None
    number = float(value)
    return number if number > 0 else None


class DiscoveryProxyMiddleware:
    """See the module's doc; settings in docs/crawlers.md."""

    def __init__(
        self,
        crawler: Crawler,
        pool: LeasePool,
        policy: BanDetector,
        *,
        ban_retries: int,
        error_exceptions: tuple[type[BaseException], ...],
    ) -> None:
        self.crawler = crawler
        self.pool = pool
        self.error_exceptions = error_exceptions
        self._rotation = Rotation(pool, policy, ban_retries=ban_retries, count=self._count)
        self._closing: asyncio.Task[None] | None = None

    @property
    def policy(self) -> BanDetector:
        return self._rotation.policy

    @property
    def ban_retries(self) -> int:
        return self._rotation.ban_retries

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        if not settings.getbool("DISCOVERY_ENABLED", True):
            raise NotConfigured("DISCOVERY_ENABLED is off")
        url = settings.get("DISCOVERY_URL")
        if not url:
            # Not NotConfigured: that would quietly send every request without a proxy.
            raise ValueError(
                "DiscoveryProxyMiddleware is enabled but DISCOVERY_URL is not set "
                "(set DISCOVERY_ENABLED = False to crawl without it)"
            )
        if not is_asyncio_available():
            raise RuntimeError(
                "DiscoveryProxyMiddleware needs Scrapy's asyncio reactor: TWISTED_REACTOR = "
                '"twisted.internet.asyncioreactor.AsyncioSelectorReactor" (the default)'
            )
        stats = crawler.stats

        def count(key: str, n: int) -> None:
            if stats is not None:
                stats.inc_value(f"discovery/{key}", n)

        labels = settings.getdict("DISCOVERY_LABELS") or None
        spider_name = getattr(crawler.spidercls, "name", None) or "spider"
        options = Options(
            token=settings.get("DISCOVERY_TOKEN") or None,
            provider=settings.get("DISCOVERY_PROVIDER") or None,
            zone=settings.get("DISCOVERY_ZONE") or None,
            labels={str(k): str(v) for k, v in labels.items()} if labels else None,
            ttl=_optional_float(settings, "DISCOVERY_LEASE_TTL"),
            per_site=settings.getint("DISCOVERY_PROXIES_PER_SITE", DEFAULTS.per_site),
            wait=settings.getfloat("DISCOVERY_WAIT", DEFAULTS.wait),
            idle=_optional_float(settings, "DISCOVERY_IDLE_RELEASE", DEFAULTS.idle),
            ban_retries=settings.getint("DISCOVERY_BAN_RETRIES", DEFAULTS.ban_retries),
        )
        pool = LeasePool(
            str(url),
            holder=settings.get("DISCOVERY_HOLDER") or default_holder(f"scrapy:{spider_name}"),
            count=count,
            **options.pool_settings(),
        )
        errors = tuple(
            load_object(path)
            for path in settings.getlist(
                "DISCOVERY_ERROR_EXCEPTIONS", list(DEFAULT_ERROR_EXCEPTIONS)
            )
        )
        middleware = cls(
            crawler,
            pool,
            ban_policy(crawler),
            ban_retries=options.ban_retries,
            error_exceptions=errors,
        )
        crawler.signals.connect(middleware.spider_closed, signal=signals.spider_closed)
        return middleware

    # -- the downloader middleware methods -------------------------------------------------

    async def process_request(self, request: Request) -> None:
        meta = request.meta
        if META_LEASE not in meta and "proxy" in meta:
            return None  # the request names its own proxy (or None: direct): left alone
        meta[META_LEASE] = None
        site = site_of(request.url)
        try:
            held = await self.pool.acquire(site)
        except PoolClosed:
            raise IgnoreRequest("the spider is closing: no more leases") from None
        except DiscoveryError as exc:
            if exc.status in _FATAL_STATUSES:
                self._close_spider(f"discovery_{exc.error}")
            raise
        meta["proxy"] = held.url
        meta[META_LEASE] = held.id
        meta[META_PROXY] = held.name
        self._count("requests")
        return None

    async def process_response(self, request: Request, response: Response) -> Request | Response:
        if META_LEASE not in request.meta:
            return response
        held = self.pool.lookup(request.meta[META_LEASE])
        if held is not None:
            self.pool.done(held)
        # Case-insensitive names, as in httpx.
        headers = cast("Mapping[str, str]", response.headers.to_unicode_dict())
        outcome = await self._rotation.settle(held, response.status, headers, response.body)
        if outcome == "ok":
            return response
        return self._retry(request, response, reason(outcome, response.status))

    async def process_exception(self, request: Request, exception: Exception) -> None:
        held = self.pool.lookup(request.meta.get(META_LEASE))
        if held is None:
            return None
        self.pool.done(held)
        if self._proxy_failed(exception):
            await self.pool.failed(held)
        return None  # Scrapy's RetryMiddleware decides whether to try again

    def _proxy_failed(self, exception: Exception) -> bool:
        said = proxy_failed(exception)  # an httpx error in the chain says
        if said is not None:
            return said
        if not isinstance(exception, self.error_exceptions):
            return False
        if isinstance(exception, TunnelError):
            status = _TUNNEL_STATUS.search(str(exception))
            return status is None or int(status.group(1)) == PROXY_AUTH_REQUIRED
        return True

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        held = len(self.pool.leases())
        await self.pool.aclose()
        logger.info("released %d leases (spider closed: %s)", held, reason)

    # -- helpers -----------------------------------------------------------------------------

    def _retry(self, request: Request, response: Response, why: str) -> Request | Response:
        tries = int(request.meta.get(META_BAN_RETRIES, 0))
        proxy = request.meta.get(META_PROXY)
        if not self._rotation.again(tries):
            logger.warning(
                "%s through %s: %s; gave up after %d retries on other proxies",
                request,
                proxy,
                why,
                tries,
            )
            return response
        logger.info("%s through %s: %s; retrying on another proxy", request, proxy, why)
        again = request.copy()
        again.meta[META_BAN_RETRIES] = tries + 1
        again.dont_filter = True
        return again

    def _count(self, key: str, n: int = 1) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(f"discovery/{key}", n)

    def _close_spider(self, reason: str) -> None:
        engine = self.crawler.engine
        if self._closing is not None or engine is None:
            return
        logger.error("the discovery service refuses this crawler: closing the spider (%s)", reason)
        self._closing = asyncio.get_running_loop().create_task(
            engine.close_spider_async(reason=reason)
        )
