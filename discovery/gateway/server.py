"""The gateway's client connections (docs/gateway.md).

A client connection is an asyncio protocol whose bytes httptools parses:
requests are taken one at a time (reading pauses while one is answered, so
a client that pipelines without reading holds at most one read's worth), a
head must arrive whole within HEAD_TIMEOUT_S and fit in MAX_HEAD_BYTES (the
API's limits, discovery/connections.py). `CONNECT` becomes a tunnel
(tunnel.py); an absolute-form `http://` request is forwarded (forward.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, cast

import httptools

from discovery.connections import MAX_HEAD_BYTES, REQUEST_TIMEOUT
from discovery.fleet import FleetProxy
from discovery.gateway.identity import Identity, Refusal
from discovery.gateway.upstream import Upstream
from discovery.gateway.wire import RequestHead, answer

if TYPE_CHECKING:
    from discovery.gateway.listener import Gateway

log = logging.getLogger("discovery.gateway")

HEAD_TIMEOUT_S = REQUEST_TIMEOUT
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ClientConnection(asyncio.Protocol):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.transport: asyncio.Transport | None = None
        self.address: str | None = None
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._request: RequestHead | None = None
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self.queue: deque[RequestHead] = deque()
        self.leftover = b""  # what followed a CONNECT head
        self._handler: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self.gone = False
        self.upstream: Upstream | None = None  # kept alive between plain requests
        self.upstream_proxy: FleetProxy | None = None  # what `upstream` is connected to
        self.paused_peer: asyncio.Transport | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        peer = self.transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else None
        gateway = self.gateway
        if len(gateway.connections) >= gateway.max_connections:
            self._refused = True
            gateway.metrics.count(True, "limit")
            detail = "the gateway holds all the connections it may"
            self.transport.write(answer(503, "overloaded", detail, close=True))
            self.transport.close()
            return
        gateway.connections.add(self)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport is None or self.transport.is_closing():
            return
        if self._parser is None:
            return
        if self._request is None or self._in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            offset = upgrade.args[0] if upgrade.args else len(data)
            self.leftover = data[offset:]
            self.transport.pause_reading()
            self._take_connect()
            return
        except httptools.HttpParserError:
            self.refuse(400, "bad_request", "the request is not valid HTTP/1.1")
            return
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large()

    def _head_too_large(self) -> None:
        self.refuse(431, "head_too_large", f"request heads are limited to {MAX_HEAD_BYTES} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self._disarm()
        self.gateway.connections.discard(self)
        if self._handler is not None and not self._handler.done():
            self._handler.cancel()
        self.drop_upstream()
        self.detach()

    def detach(self) -> None:
        """Drops what refers back to this connection (the parser's callbacks,
        the handler), once it is closed or a tunnel: freed by reference
        counting, not by the garbage collector."""
        self._parser = None
        self._handler = None

    def pause_writing(self) -> None:
        if self.paused_peer is not None:
            self.paused_peer.pause_reading()

    def resume_writing(self) -> None:
        if self.paused_peer is not None and not self.paused_peer.is_closing():
            self.paused_peer.resume_reading()

    # -- httptools callbacks ---------------------------------------------------------------

    _in_head = True
    _parsed = 0  # the head's bytes as the parser handed them over

    def on_message_begin(self) -> None:
        self._request = RequestHead(b"", b"", "1.1")
        self._in_head = True
        self._parsed = 0
        self._body, self._body_size = [], 0

    def on_url(self, url: bytes) -> None:
        assert self._request is not None
        self._request.target += url
        self._parsed += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._request is not None
        self._request.headers.append((name.lower(), value))
        self._parsed += len(name) + len(value) + 4  # name: value CRLF

    def on_headers_complete(self) -> None:
        request = self._request
        assert request is not None and self.transport is not None
        self._in_head = False
        self._head_bytes = 0
        if self._parsed > MAX_HEAD_BYTES:  # a whole head, however many reads it took
            self._head_too_large()
            return
        parser = self._parser
        assert parser is not None
        request.method = parser.get_method()
        request.version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        length = request.header(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.gateway.settings.max_body:
            self._body_too_large()
            return
        expect = request.header(b"expect")
        if (
            expect is not None
            and expect.lower() == b"100-continue"
            and request.method != b"CONNECT"
        ):
            self.transport.write(_CONTINUE)  # the body is read here, whole, before it goes on

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._body_size += len(body)
        if self._body_size > self.gateway.settings.max_body:
            self._body_too_large()

    def _body_too_large(self) -> None:
        limit = self.gateway.settings.max_body
        self.refuse(413, "body_too_large", f"request bodies are limited to {limit} bytes")

    def on_message_complete(self) -> None:
        request = self._request
        if request is None or self._refused:
            return
        if request.method == b"CONNECT":
            return  # the upgrade exception follows
        request.body = b"".join(self._body)
        self._request, self._body = None, []
        self._enqueue(request)

    # -- requests --------------------------------------------------------------------------

    def _take_connect(self) -> None:
        request = self._request
        if request is None:
            return
        self._request = None
        self._enqueue(request)

    def _enqueue(self, request: RequestHead) -> None:
        assert self.transport is not None
        self._disarm()
        self.queue.append(request)
        self.transport.pause_reading()  # one request at a time
        if self._handler is None or self._handler.done():
            self._handler = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        from discovery.gateway.forward import forward
        from discovery.gateway.tunnel import open_tunnel

        while self.queue and not self.gone:
            request = self.queue.popleft()
            identity = self.admit(request)
            if identity is None:
                return
            if request.method == b"CONNECT":
                await open_tunnel(self, request, identity)
                return  # the connection is a tunnel now, or closed
            if not await forward(self, request, identity):
                self.close()
                return
        if not self.gone and self.transport is not None:
            self._arm()
            self.transport.resume_reading()

    def admit(self, request: RequestHead) -> Identity | None:
        """The request's identity; None after answering a refusal."""
        header = request.header(b"proxy-authorization")
        decision = self.gateway.admission.admit(header, self.address)
        if isinstance(decision, Refusal):
            extra: list[tuple[bytes, bytes]] = []
            if decision.status == 407:
                extra.append((b"proxy-authenticate", b'Basic realm="egress-proxies"'))
            if decision.retry_after is not None:
                extra.append((b"retry-after", b"%d" % decision.retry_after))
            self.count(request, "refused")
            self.refuse(decision.status, decision.reason, decision.detail, extra)
            return None
        return decision

    def count(self, request: RequestHead, outcome: str) -> None:
        self.gateway.metrics.count(request.method == b"CONNECT", outcome)

    def refuse(
        self,
        status: int,
        reason: str,
        detail: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Answers with the gateway's own error and closes the connection."""
        self._refused = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(answer(status, reason, detail, extra=extra or [], close=True))
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        self.upstream, self.upstream_proxy, self.paused_peer = None, None, None

    # -- the head deadline -----------------------------------------------------------------

    def _arm(self) -> None:
        if self._deadline is None and self.transport is not None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(HEAD_TIMEOUT_S, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self._request is not None and not self._refused:
            self.refuse(408, "request_timeout", f"no complete request within {HEAD_TIMEOUT_S:g} s")
        else:
            self.close()  # idle between requests


__all__ = ["HEAD_TIMEOUT_S", "ClientConnection"]
