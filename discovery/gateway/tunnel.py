"""CONNECT: a tunnel through a leased squid, TLS untouched end to end (the
client's TLS handshake is its own: the gateway sees only the host and port).

The squid is asked to CONNECT with its own credentials; a squid that
refuses the connection, drops it, gives no connection in time or rejects
those credentials is reported `error` and the tunnel is tried once more on
another proxy before the client gets an answer. What the squid decides about
the destination (403: a port or address its rules refuse; 502/503/504: it
could not reach the site) is the client's answer, not the proxy's fault;
and so is no answer in time (a 504, take.no_answer): the squid is still
trying to reach the site.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from discovery.gateway.holds import Hold
from discovery.gateway.identity import Identity
from discovery.gateway.relay import Tunnel
from discovery.gateway.take import no_answer, site_of, take, upstream_failed
from discovery.gateway.upstream import NoAnswer, Upstream, UpstreamError
from discovery.gateway.wire import TUNNEL_OPEN, RequestHead, basic_credentials

if TYPE_CHECKING:
    from discovery.gateway.server import ClientConnection

log = logging.getLogger("discovery.gateway")

ATTEMPTS = 2


def split_authority(target: bytes) -> tuple[str, int] | None:
    """`host:port` or `[v6]:port` of a CONNECT request; None when malformed."""
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    return host, int(port)


async def open_tunnel(conn: ClientConnection, request: RequestHead, identity: Identity) -> None:
    gateway = conn.gateway
    authority = split_authority(request.target)
    if authority is None:
        conn.count(request, "bad_request")
        conn.refuse(400, "bad_target", "CONNECT takes HOST:PORT (an IPv6 host in brackets)")
        return
    host, _port = authority
    site = site_of(conn, request, host)
    if site is None:
        return
    if len(gateway.tunnels) >= gateway.settings.max_tunnels:
        conn.count(request, "limit")
        detail = f"the gateway has {len(gateway.tunnels)} tunnels open, the most it may"
        conn.refuse(503, "tunnel_limit", detail, [(b"retry-after", b"1")])
        return
    if gateway.holder_tunnels[identity.holder] >= gateway.settings.holder_tunnels:
        conn.count(request, "limit")
        detail = f"{identity.holder} has {gateway.settings.holder_tunnels} tunnels open, the most a holder may"
        conn.refuse(503, "holder_tunnel_limit", detail, [(b"retry-after", b"1")])
        return
    started = time.perf_counter()
    for attempt in range(1, ATTEMPTS + 1):
        hold = await take(conn, request, identity, site)
        if hold is None:
            return
        upstream: Upstream | None = None
        try:
            proxy = hold.lease.proxy
            upstream = await Upstream.open(
                proxy.host, proxy.port, answer_timeout=gateway.settings.answer_timeout
            )
            status, _head, rest = await upstream.handshake(
                request.target, basic_credentials(proxy.username, proxy.password)
            )
            if status == 407:
                raise UpstreamError("auth", "the squid refused the fleet's credentials")
        except UpstreamError as failure:
            if upstream is not None:
                upstream.close()
            gateway.holds.done(hold)
            last = attempt == ATTEMPTS or conn.gone
            await upstream_failed(conn, request, hold, site, failure, last=last)
            if last:
                return
            continue
        except NoAnswer as failure:
            if upstream is not None:
                upstream.close()
            gateway.holds.done(hold)
            no_answer(conn, request, failure)
            return
        except BaseException:  # the client went away (cancelled) meanwhile
            if upstream is not None:
                upstream.close()
            gateway.holds.done(hold)
            raise
        gateway.metrics.first_byte.observe(time.perf_counter() - started)
        if status != 200:
            gateway.holds.done(hold)
            upstream.close()
            conn.count(request, "denied")
            detail = f"the proxy answered {status} for {request.target.decode()}"
            conn.refuse(
                status if status in (403, 502, 503, 504) else 502, "upstream_answer", detail
            )
            return
        _splice(conn, upstream, hold, identity, rest)
        conn.count(request, "ok")
        return


def _splice(
    conn: ClientConnection, upstream: Upstream, hold: Hold, identity: Identity, early: bytes
) -> None:
    gateway = conn.gateway
    client = conn.transport
    assert client is not None and upstream.transport is not None
    holder = identity.holder
    gateway.holder_tunnels[holder] += 1

    def closed(tunnel: Tunnel) -> None:
        gateway.tunnels.discard(tunnel)
        gateway.connections.discard(conn)
        hold.closers.discard(tunnel.abort)
        left = gateway.holder_tunnels[holder] - 1
        if left > 0:
            gateway.holder_tunnels[holder] = left
        else:
            del gateway.holder_tunnels[holder]
        gateway.metrics.moved(hold.proxy, holder, tunnel.up, tunnel.down)
        gateway.holds.done(hold)

    conn.detach()
    client.write(TUNNEL_OPEN)
    tunnel = Tunnel(client, upstream.transport, on_close=closed)
    gateway.tunnels.add(tunnel)
    hold.closers.add(tunnel.abort)
    tunnel.start(to_upstream=conn.leftover, to_client=early)
    conn.leftover = b""


__all__ = ["open_tunnel", "split_authority"]
