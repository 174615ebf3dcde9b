"""What an answer through a proxy says about the proxy (`verdict`: the one
rule the httpx transports, the Scrapy middleware and the service's gateway
apply), what an error says about it (`proxy_failed`), what counts as a ban,
and whom a lease is for: the site (a URL's host)."""

from __future__ import annotations

import os
import re
import socket
import ssl
from collections.abc import Iterable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

import anyio
import httpx

from egress_proxies_client._protocol import Outcome

DEFAULT_BAN_STATUSES: tuple[int, ...] = (403, 429, 503)
# The proxy refused our credentials: the proxy's fault, not the site's.
PROXY_AUTH_REQUIRED = 407
# On squid's own error pages (it could not reach the site, or its rules refuse
# the destination): the site's failure or ours, neither a ban nor the proxy's.
SQUID_ERROR = "x-squid-error"


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


def verdict(policy: BanDetector, status: int, headers: Mapping[str, str], body: bytes) -> Outcome:
    """What an answer through a proxy says about that proxy, to report:

    - `error` for a 407: the proxy refused its credentials (counted against
      its health, not the site's doing);
    - `ok` for squid's own error page (`X-Squid-Error`): not the site's answer;
    - `blocked` for what `policy` calls a ban (the site refuses this proxy);
    - `ok` for anything else.

    `headers` with case-insensitive names (or lower-cased ones); `body` the
    decoded body (b"" when it was not read).
    """
    if status == PROXY_AUTH_REQUIRED:
        return "error"
    if SQUID_ERROR in headers:
        return "ok"
    return "blocked" if policy.is_ban(status, headers, body) else "ok"


def proxy_failed(error: BaseException) -> bool | None:
    """What an error raised by a request through a proxy says of the proxy:

    - True: the proxy failed: no connection to it (refused, unreachable,
      timed out), or it refused its credentials (a CONNECT answered 407).
      Reported `error`, which counts against its health.
    - False: the failure is past the proxy: the site's TLS (a bad
      certificate, a handshake cut off: the site's end of the tunnel), a
      CONNECT the proxy answered with another status (its word on the site:
      unreachable, a port its rules refuse), no answer in time, a connection
      closed mid-answer. Nothing is reported: two `error` reports in a row
      make a proxy unhealthy, and one site with a dead server or an expired
      certificate would otherwise take healthy proxies out one after
      another; a proxy that really hangs fails its health probes.
    - None: nothing in the error says (no httpx error in its chain): the
      caller's own rule decides (the Scrapy middleware's list).

    A TLS handshake with the site that times out counts as no connection to
    the proxy: httpx raises the same ConnectTimeout for both.
    """
    chain = _chain(error)
    if any(
        isinstance(e, (ssl.SSLError, anyio.EndOfStream, anyio.BrokenResourceError)) for e in chain
    ):
        return False
    for e in chain:
        if isinstance(e, httpx.ProxyError):
            return connect_status(str(e)) == PROXY_AUTH_REQUIRED
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            return True
        if isinstance(e, httpx.TransportError):
            return False
    return None


def connect_status(message: str) -> int | None:
    """The status of a refused CONNECT, from httpx's ProxyError ("407 Proxy
    Authentication Required")."""
    head = message.split(" ", 1)[0]
    return int(head) if head.isdigit() else None


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    at: BaseException | None = error
    while at is not None and at not in chain:
        chain.append(at)
        at = at.__cause__ or at.__context__
    return chain


def needs_body(policy: BanDetector) -> bool:
    """Whether `policy` looks at bodies (a policy that does not say is assumed to)."""
    return bool(getattr(policy, "needs_body", True))


def site_of(url: str | httpx.URL) -> str:
    """The site a URL belongs to: its host name, lower-cased (IPv6 without brackets).
    Leases, cooldowns and bans are per site."""
    host = url.host if isinstance(url, httpx.URL) else urlsplit(url).hostname
    if not host:
        raise ValueError(f"{str(url)!r} has no host name: no site to lease a proxy for")
    return host.lower().rstrip(".")


def target_of(site: str) -> str:
    """The service's `target` for a site (an IPv6 literal needs its brackets)."""
    return f"[{site}]" if ":" in site else site


def default_holder(kind: str) -> str:
    """`kind@host:pid`: who holds the leases, as the service's debug log shows it."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"
