"""Back-pressure for pipelined requests and unread answers (docs/discovery.md,
"Connections and file descriptors"), on uvicorn's httptools protocol.

uvicorn hands each read (up to 256 KiB) to the parser whole, and httptools
parses every request in it at once: a client that pipelines tiny requests
queues thousands of them per read, about 2 KiB each, and uvicorn resumes
reading after every answer however long the queue is. A client that never
reads its answers then fills the service's memory without limit, and once
the socket's send buffer is full each answer waits for the client forever:
nothing closes the connection.

So, per connection:

- at most `max_pipelined` requests wait behind the one being answered. A
  read is fed to the parser a head at a time (up to each CRLFCRLF; llhttp
  accepts no other end of a head), and once the queue is full the rest of
  the read is held and reading paused; held bytes are fed as answers go out,
  and reading resumes only when nothing is held and the queue has room
  (`ReadGate`: uvicorn's own resume calls pass through it). One held read,
  at most 256 KiB, is all the input a connection keeps;
- answers the client does not read are not kept past `write_timeout`: when
  the transport's buffer goes over its high-water mark (uvicorn then stops
  answering, `pause_writing`), or when the connection is closed with
  answers still unsent (a close waits for them to be flushed, which a client
  that does not read never lets happen), a timer starts. When it fires, a
  buffer that has shrunk since (the client reads, if slowly) gets another
  period; one that has not is reset (`reset`: RST, so that neither the
  service nor the kernel keeps the unread bytes);
- at the connection cap, after idle connections, those with answers unread
  (`stalled`) and then those with requests queued (`queued`) are pushed out
  before anyone is refused: a client that pipelines always has a request in
  hand, so it would never be idle, and a few hundred of them could take every
  place while one-request-at-a-time crawlers got 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import ClassVar, Protocol

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

MAX_PIPELINED = 16  # requests a connection may have waiting behind the one being answered
WRITE_TIMEOUT = 10.0  # seconds answers may wait, unread, before the connection is aborted
_END_OF_HEAD = b"\r\n\r\n"


class PipelineLimits(Protocol):
    """What the protocol needs of the server's guard (connections.ConnectionGuard)."""

    max_pipelined: int
    write_timeout: float
    # Connections whose answers wait for the client to read them, the longest waiting first.
    stalled: dict[object, asyncio.Transport]
    # Connections with requests queued behind the one being answered, the first queued first.
    queued: dict[object, asyncio.Transport]

    def write_timed_out(self) -> None:
        """Counts a connection aborted for answers left unread."""


def reset(transport: asyncio.Transport) -> None:
    """Closes at once, unsent bytes dropped: SO_LINGER 0 makes the close a TCP reset,
    where a plain close would leave the kernel trying to deliver them for minutes."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class ReadGate(FlowControl):
    """uvicorn's flow control, whose resume_reading is a no-op while `may_read` says no:
    uvicorn calls it after every answer and on every body read, queue or not."""

    def __init__(self, transport: asyncio.Transport, may_read: Callable[[], bool]) -> None:
        super().__init__(transport)
        self._may_read = may_read

    def resume_reading(self) -> None:
        if self.read_paused and self._may_read():
            super().resume_reading()


class BackpressuredProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of the module's docstring;
    `limits` is set by the subclass (connections.protocol_class)."""

    limits: ClassVar[PipelineLimits]
    _held = b""  # the part of a read not fed to the parser yet (the queue was full)
    _write_deadline: asyncio.TimerHandle | None = None  # armed while answers wait unread
    _unsent = 0  # the transport's buffer when the write timer was armed
    _lost = False
    _queued = False  # in limits.queued
    _answering: RequestResponseCycle | None = None  # the request being answered

    def connection_made(  # type: ignore[override]  # as uvicorn's
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        self.flow = ReadGate(transport, self._may_read)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._held = b""
        self._unstall()
        if self._queued:
            self.limits.queued.pop(self, None)
        # uvicorn tells only the last request parsed that the client is gone, and
        # then wakes every answer waiting for the buffer to drain: the one being
        # answered, an earlier one when requests were queued, would write to the
        # closed transport (uvloop raises: one traceback per connection).
        if self._answering is not None and not self._answering.response_complete:
            self._answering.disconnected = True
            self._answering.message_event.set()
        self.pipeline.clear()  # never to be answered
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def _may_read(self) -> bool:
        return not self._held and len(self.pipeline) < self.limits.max_pipelined

    # -- the read side -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._held:  # read before the pause took effect: kept behind what is held
            self._held += data
            self.flow.pause_reading()
            return
        end = data.find(_END_OF_HEAD)
        if (end < 0 or end + len(_END_OF_HEAD) == len(data)) and not self.pipeline:
            self._feed(data)  # at most one head ends in it: the usual read, fed whole
            if self.pipeline:
                self._note_queue()
            return
        self._feed_bounded(data)

    def _feed_bounded(self, data: bytes) -> None:
        """Feeds `data` a head at a time while the queue has room; holds the rest."""
        whole, start = memoryview(data), 0
        while start < len(data) and not self.transport.is_closing():
            if len(self.pipeline) >= self.limits.max_pipelined:
                self._held = data[start:]
                self.flow.pause_reading()
                break
            end = data.find(_END_OF_HEAD, start)
            stop = len(data) if end < 0 else end + len(_END_OF_HEAD)
            piece = data if stop - start == len(data) else whole[start:stop]
            self._feed(piece)  # type: ignore[arg-type]  # httptools takes a memoryview
            start = stop
        self._note_queue()

    def _note_queue(self) -> None:
        if self.pipeline:
            if not self._queued:
                self._queued = True
                self.limits.queued[self] = self.transport
        elif self._queued:
            self._queued = False
            self.limits.queued.pop(self, None)

    # One piece of a read to the parser (the subclass counts heads' bytes around it):
    # uvicorn's data_received itself, one call less on every request.
    _feed = HttpToolsProtocol.data_received

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next queued request, if any
        if self.transport.is_closing():
            self._linger()
        elif self._queued:  # requests were queued, or held: one went out of the queue
            if self._held and len(self.pipeline) < self.limits.max_pipelined:
                held, self._held = self._held, b""
                self._feed_bounded(held)
            else:
                self._note_queue()
            self.flow.resume_reading()  # uvicorn's call came before the queue shrank

    # -- the write side ----------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._stall()

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.transport.is_closing():
            self._unstall()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._linger()

    def send_400_response(self, msg: str) -> None:
        super().send_400_response(msg)
        self._linger()

    def _linger(self) -> None:
        """After a close: answers still unsent must be read within the write timeout."""
        if not self._lost and self.transport.get_write_buffer_size() > 0:
            self._stall()

    def _stall(self) -> None:
        if self._write_deadline is None and not self._lost:
            self._arm_write_timer()
            self.limits.stalled[self] = self.transport

    def _arm_write_timer(self) -> None:
        self._unsent = self.transport.get_write_buffer_size()
        self._write_deadline = self.loop.call_later(
            self.limits.write_timeout, self._write_timed_out
        )

    def _unstall(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
            self.limits.stalled.pop(self, None)

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        unsent = 0 if self._lost else self.transport.get_write_buffer_size()
        if 0 < unsent < self._unsent:
            self._arm_write_timer()  # read from, if slowly: another period
            return
        self.limits.stalled.pop(self, None)
        if unsent:
            self.limits.write_timed_out()
            reset(self.transport)
