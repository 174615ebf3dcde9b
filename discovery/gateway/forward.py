"""Plain `http://` requests (absolute form), forwarded through a leased squid
with keep-alive on both sides.

Here the gateway sees the site's answer and judges it by the crawler
client's rule (`verdict`, bans.py): a ban is reported `blocked` for the
site, which moves the session or the site's set to another proxy, and an
idempotent request without a body is sent once more through another proxy.
Squid's own error pages (`X-Squid-Error`: it could not reach the site) are
the site's failure, not a ban, and go to the client as they are. A squid
that fails (refused, reset, no connection in time, an answer that is no
HTTP, its credentials refused: a 407, `error` by the verdict) is reported
`error`, and a request that may be sent twice is sent once more. A squid
that took the request and does not answer in time is waiting on the site,
for all the gateway knows: the client gets a 504 and nothing is reported
(take.no_answer).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httptools

from discovery.gateway.bans import verdict
from discovery.gateway.holds import Hold
from discovery.gateway.identity import Identity
from discovery.gateway.take import no_answer, site_of, take, upstream_failed
from discovery.gateway.upstream import Answer, NoAnswer, Upstream, UpstreamError
from discovery.gateway.wire import RequestHead, basic_credentials, forward_request, response_head

if TYPE_CHECKING:
    from discovery.gateway.server import ClientConnection

ATTEMPTS = 2


async def forward(conn: ClientConnection, request: RequestHead, identity: Identity) -> bool:
    """Answers one request; whether the client connection may carry another."""
    try:
        url = httptools.parse_url(request.target)
    except httptools.HttpParserInvalidURLError:
        url = None
    if url is None or url.schema != b"http" or not url.host:
        conn.count(request, "bad_request")
        detail = "send absolute http:// URLs, and CONNECT for https://"
        conn.refuse(400, "bad_target", detail)
        return False
    host = url.host.decode("ascii", "replace")
    site = site_of(conn, request, host)
    if site is None:
        return False
    gateway = conn.gateway
    started = time.perf_counter()
    for attempt in range(1, ATTEMPTS + 1):
        hold = await take(conn, request, identity, site)
        if hold is None:
            return False
        last = attempt == ATTEMPTS or not request.retryable
        try:
            outcome = await _exchange(conn, request, hold, site, started, last=last)
        finally:
            gateway.holds.done(hold)
        if outcome is not None:
            return outcome
    return False  # pragma: no cover - the last attempt always answers


async def _exchange(
    conn: ClientConnection,
    request: RequestHead,
    hold: Hold,
    site: str,
    started: float,
    *,
    last: bool,
) -> bool | None:
    """One try through `hold`: whether the connection may carry another request,
    or None when the request is to be tried again through another proxy."""
    gateway = conn.gateway
    proxy = hold.lease.proxy
    wire = forward_request(
        request, request.target, basic_credentials(proxy.username, proxy.password)
    )
    try:
        upstream, answer = await _send(conn, hold, wire, head_only=request.method == b"HEAD")
        outcome = verdict(gateway.policy, answer.status, _text_headers(answer), b"")
        if outcome == "error":
            raise UpstreamError("auth", "the squid refused the fleet's credentials")
    except UpstreamError as failure:
        conn.drop_upstream()
        await upstream_failed(conn, request, hold, site, failure, last=last)
        return False if last else None
    except NoAnswer as failure:
        conn.drop_upstream()
        no_answer(conn, request, failure)
        return False
    gateway.metrics.first_byte.observe(time.perf_counter() - started)
    banned = outcome == "blocked"
    if banned:
        await gateway.holds.report(hold, "blocked", site)
        if not last:
            conn.drop_upstream()
            return None
    down = await _relay(conn, upstream, answer)
    gateway.metrics.moved(hold.proxy, hold.identity.holder, len(wire), down)
    conn.count(request, "banned" if banned else "ok")
    if not upstream.reusable:
        conn.drop_upstream()
    return request.keep_alive and answer.keep_alive


async def _send(
    conn: ClientConnection, hold: Hold, wire: bytes, *, head_only: bool
) -> tuple[Upstream, Answer]:
    """The request on the connection kept to this proxy, or a new one (a kept
    connection the squid closed meanwhile is no failure: a new one is tried)."""
    proxy = hold.lease.proxy
    # The same record, not only the same name: a proxy that moved is not
    # reached through a connection to its old address.
    kept = conn.upstream if conn.upstream_proxy == proxy else None
    if kept is not None and not kept.closed:
        try:
            return kept, await kept.exchange(wire, head_only=head_only)
        except UpstreamError as failure:
            if failure.kind not in ("closed", "reset"):
                raise
    conn.drop_upstream()
    upstream = await Upstream.open(
        proxy.host, proxy.port, answer_timeout=conn.gateway.settings.answer_timeout
    )
    conn.upstream, conn.upstream_proxy = upstream, proxy
    assert upstream.transport is not None
    conn.paused_peer = upstream.transport
    return upstream, await upstream.exchange(wire, head_only=head_only)


async def _relay(conn: ClientConnection, upstream: Upstream, answer: Answer) -> int:
    """The answer to the client, its body streamed as it comes; bytes sent."""
    client = conn.transport
    assert client is not None
    close = not answer.keep_alive
    if answer.chunked:
        framing = b"transfer-encoding: chunked"
    elif answer.length is not None:
        framing = b"content-length: %d" % answer.length
    else:
        framing = b""
    head = response_head(answer.status, answer.reason, answer.headers, framing=framing, close=close)
    client.write(head)
    sent = len(head)

    def body(data: bytes) -> None:
        nonlocal sent
        chunk = b"%x\r\n%s\r\n" % (len(data), data) if answer.chunked else data
        client.write(chunk)
        sent += len(chunk)

    upstream.stream_to(body)
    await upstream.complete()
    if answer.chunked:
        client.write(b"0\r\n\r\n")
        sent += 5
    return sent


def _text_headers(answer: Answer) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in answer.headers}


__all__ = ["forward"]
