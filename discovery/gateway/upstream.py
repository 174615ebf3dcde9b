"""Connections from the gateway to a leased squid: the CONNECT handshake, and
plain HTTP exchanges whose answers are parsed (httptools) so the gateway sees
the status before the client does, and knows where each answer ends (keep-
alive on both sides).

Any failure of the squid itself (refused, reset, closed early, no connection
in time, an answer that is no HTTP) raises UpstreamError with its `kind`,
which is what the `error` report and the metrics say. A squid that took the
request and sends no answer in time raises NoAnswer instead: it waits on
the site (a dead host, a slow server), as far as the gateway can tell, and
only the health probes may say otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from discovery.gateway.wire import Headers, connect_request, parse_status_line

CONNECT_TIMEOUT_S = 5.0  # to open the TCP connection to a squid
MAX_ANSWER_HEAD = 64 * 1024


class UpstreamError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # refused | reset | timeout | closed | protocol | unreachable | auth


class NoAnswer(Exception):
    """The squid took the request and sent no answer head in time."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"no answer through the proxy within {timeout:g} s: the site may be slow or unreachable"
        )


@dataclass
class Answer:
    """A squid's answer head to a plain HTTP request."""

    status: int
    reason: bytes
    headers: Headers
    version: str
    keep_alive: bool
    chunked: bool
    length: int | None


class Upstream(asyncio.Protocol):
    """One TCP connection to a squid."""

    def __init__(self, answer_timeout: float) -> None:
        # For a squid's answer head (it reaches the site first): the gateway's
        # --gateway-answer-timeout (GatewaySettings.answer_timeout).
        self.answer_timeout = answer_timeout
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        # An HTTP answer being read (begin_answer).
        self._parser: httptools.HttpResponseParser | None = None
        self._head_only = False
        self._answer: Answer | None = None
        self._headers: Headers = []
        self._reason = b""
        self._head: asyncio.Future[Answer] | None = None
        self._complete: asyncio.Future[None] | None = None
        self.sink: Callable[[bytes], None] | None = None  # where body bytes go
        self.early: list[bytes] = []  # body bytes before a sink was set
        self.on_pause: Callable[[], None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._parser is not None:
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserError:
                self._fail(UpstreamError("protocol", "the squid's answer is not HTTP"))
            return
        self.buffer += data
        if len(self.buffer) > MAX_ANSWER_HEAD and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        if self._parser is not None and self._answer is not None and self._complete is not None:
            # An answer whose body ends with the connection (no length, not chunked).
            with contextlib.suppress(httptools.HttpParserError):
                self._parser.feed_data(b"")
            if not self._answer.chunked and self._answer.length is None:
                self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._parser = None
        self.sink = None
        self._fail(UpstreamError("reset" if exc else "closed", "the squid closed the connection"))

    # -- opening and the CONNECT handshake -------------------------------------------------

    @classmethod
    async def open(cls, host: str, port: int, *, answer_timeout: float) -> Upstream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, protocol = await loop.create_connection(lambda: cls(answer_timeout), host, port)
        except TimeoutError:
            raise UpstreamError(
                "timeout", f"no connection within {CONNECT_TIMEOUT_S:g} s"
            ) from None
        except ConnectionRefusedError:
            raise UpstreamError("refused", "the squid refused the connection") from None
        except OSError as exc:
            raise UpstreamError("unreachable", exc.strerror or type(exc).__name__) from None
        return protocol

    async def handshake(self, target: bytes, credentials: bytes | None) -> tuple[int, bytes, bytes]:
        """CONNECT `target`: the squid's (status, head, bytes after the head)."""
        assert self.transport is not None
        self.transport.write(connect_request(target, credentials))
        head = await self._read_head()
        status, _ = _status(head)
        rest = bytes(self.buffer)
        self.buffer.clear()
        return status, head, rest

    async def _read_head(self) -> bytes:
        try:
            async with asyncio.timeout(self.answer_timeout):
                while True:
                    end = self.buffer.find(b"\r\n\r\n")
                    if end >= 0:
                        head = bytes(self.buffer[: end + 4])
                        del self.buffer[: end + 4]
                        return head
                    if len(self.buffer) > MAX_ANSWER_HEAD:
                        raise UpstreamError("protocol", "the squid's answer head is too large")
                    if self.closed:
                        raise UpstreamError("closed", "the squid closed before it answered")
                    await self._wait()
        except TimeoutError:
            raise NoAnswer(self.answer_timeout) from None

    # -- plain HTTP ------------------------------------------------------------------------

    async def exchange(self, request: bytes, *, head_only: bool) -> Answer:
        """Sends one request and reads its answer's head; the body then flows
        to `sink` (set it, or call `discard`), and `complete()` waits for its end."""
        assert self.transport is not None
        if self.closed:
            raise UpstreamError("closed", "the squid closed the connection")
        loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._head_only = head_only
        self._answer, self._headers, self._reason = None, [], b""
        self._head, self._complete = loop.create_future(), loop.create_future()
        self.sink, self.early = None, []
        self.transport.write(request)
        try:
            async with asyncio.timeout(self.answer_timeout):
                return await asyncio.shield(self._head)
        except TimeoutError:
            raise NoAnswer(self.answer_timeout) from None

    async def complete(self) -> None:
        assert self._complete is not None
        await asyncio.shield(self._complete)

    def stream_to(self, sink: Callable[[bytes], None]) -> None:
        for chunk in self.early:
            sink(chunk)
        self.early = []
        self.sink = sink

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self._answer is not None and self._answer.keep_alive

    # httptools callbacks ---------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None and self._head is not None
        status = parser.get_status_code()
        version = parser.get_http_version()
        if 100 <= status < 200:
            self._headers, self._reason = [], b""  # an interim answer: the real one follows
            return
        connection = b",".join(v for k, v in self._headers if k == b"connection").lower()
        keep_alive = b"close" not in connection and (
            version == "1.1" or b"keep-alive" in connection
        )
        length = next((v for k, v in self._headers if k == b"content-length"), None)
        encoding = next((v for k, v in self._headers if k == b"transfer-encoding"), b"")
        self._answer = Answer(
            status=status,
            reason=self._reason,
            headers=self._headers,
            version=version,
            keep_alive=keep_alive,
            chunked=b"chunked" in encoding.lower(),
            length=int(length) if length is not None and length.isdigit() else None,
        )
        if not self._answer.chunked and self._answer.length is None and not self._bodiless(status):
            self._answer.keep_alive = False  # the body ends with the connection
        if not self._head.done():
            self._head.set_result(self._answer)
        if self._head_only or self._bodiless(status):
            self._finish()

    def _bodiless(self, status: int) -> bool:
        return self._head_only or status in (204, 304)

    def on_body(self, body: bytes) -> None:
        if self._answer is None or self._complete is None or self._complete.done():
            return
        if self.sink is not None:
            self.sink(body)
        else:
            self.early.append(body)

    def on_message_complete(self) -> None:
        if self._answer is not None:
            self._finish()

    def _finish(self) -> None:
        self._parser = None
        if self._complete is not None and not self._complete.done():
            self._complete.set_result(None)

    # -- internals -------------------------------------------------------------------------

    def _fail(self, error: UpstreamError) -> None:
        for future in (self._head, self._complete):
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: its waiter may be gone
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        if self.transport is not None:
            self.transport.resume_reading()
        await self._waiter


def _status(head: bytes) -> tuple[int, bytes]:
    try:
        return parse_status_line(head)
    except ValueError:
        raise UpstreamError("protocol", "the squid's answer is not HTTP") from None


__all__ = [
    "CONNECT_TIMEOUT_S",
    "Answer",
    "NoAnswer",
    "Upstream",
    "UpstreamError",
]
