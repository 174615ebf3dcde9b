"""Taking a proxy for one request or tunnel, and the gateway's 503 when none
can be had: never a hang, always a Retry-After and a reason (docs/gateway.md,
"When no proxy can be had")."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from discovery.book.errors import NoProxyAvailable, StoreUnavailable
from discovery.gateway.holds import Hold, HolderLimit
from discovery.gateway.identity import Identity
from discovery.gateway.upstream import NoAnswer, UpstreamError
from discovery.gateway.wire import RequestHead
from discovery.targets import host_of

if TYPE_CHECKING:
    from discovery.gateway.server import ClientConnection

# NoProxyAvailable.reason -> the gateway's reason word.
REASONS = {
    "no_match": "no_proxy_matches",
    "unhealthy": "no_healthy_proxy",
    "cooldown": "all_cooling_down",
    "leased": "all_leased",
}


@functools.lru_cache(maxsize=4096)
def _normalised(host: str) -> tuple[str | None, str]:
    try:
        return host_of(host), ""
    except ValueError as exc:
        return None, str(exc)


def site_of(conn: ClientConnection, request: RequestHead, host: str) -> str | None:
    """The site (normalised host) a request for `host` (an IPv6 address without
    brackets) is for; None after a 400."""
    site, problem = _normalised(f"[{host}]" if ":" in host else host)
    if site is None:
        conn.count(request, "bad_request")
        conn.refuse(400, "bad_target", problem)
    return site


async def take(
    conn: ClientConnection, request: RequestHead, identity: Identity, site: str
) -> Hold | None:
    """A hold on a proxy for `site`; None after answering 503."""
    holds = conn.gateway.holds
    try:
        return await holds.acquire(identity, site)
    except NoProxyAvailable as refusal:
        refusal.__traceback__ = None  # no cycle through the book's frame
        reason = REASONS.get(refusal.reason, refusal.reason)
        retry_after, detail = refusal.retry_after, f"no proxy for {site}: {refusal.detail}"
    except HolderLimit as exc:
        reason = "holder_limit"
        retry_after, detail = max(1, math.ceil(holds.idle_release)), str(exc)
    except StoreUnavailable as exc:
        reason, retry_after, detail = "store_unavailable", 1, str(exc)
    conn.count(request, "no_proxy" if reason != "holder_limit" else "limit")
    conn.refuse(503, reason, detail, [(b"retry-after", b"%d" % retry_after)])
    return None


async def upstream_failed(
    conn: ClientConnection,
    request: RequestHead,
    hold: Hold,
    site: str,
    failure: UpstreamError,
    *,
    last: bool,
) -> None:
    """A leased squid failed: counted, reported `error` (which moves the hold
    away), and on the last try the client's 502."""
    gateway = conn.gateway
    gateway.metrics.upstream_errors.labels(failure.kind).inc()
    await gateway.holds.report(hold, "error", site)
    if last:
        conn.count(request, "upstream_error")
        conn.refuse(502, "upstream_error", f"the proxies failed: {failure}")


def no_answer(conn: ClientConnection, request: RequestHead, failure: NoAnswer) -> None:
    """A leased squid took the request and did not answer in time: the client's
    504, and no report. A dead or slow site looks just like this, and
    blaming the proxy for it would mark healthy proxies failed one after
    another (two reports in a row make one unhealthy) for one bad site;
    a squid that hangs for every site fails its health probes instead. Not
    tried again elsewhere: another proxy would wait on the same site."""
    conn.gateway.metrics.upstream_errors.labels("no_answer").inc()
    conn.count(request, "no_answer")
    conn.refuse(504, "upstream_timeout", str(failure))


__all__ = ["REASONS", "no_answer", "site_of", "take", "upstream_failed"]
