"""Bounds on HTTP connections that uvicorn does not set by itself (docs/discovery.md,
"Connections and file descriptors").

uvicorn (httptools protocol) arms its keep-alive timer only once a response
has gone out: a connection that never sends a request, or sends half of one,
is held for as long as the client likes, and each one is a file descriptor.
With the 1,024 descriptors a systemd service gets by default, about a
thousand idle sockets starve the health engine, whose probes then fail with
EMFILE. uvicorn's own `limit_concurrency` does not help: it is checked when a
request's head is complete, so it never sees an idle or half-sent connection,
and it answers 503 only after accepting and holding one. Nor does uvicorn
have a header-read timeout (h11's `h11_max_incomplete_event_size` bounds the
head's size, and only in the h11 protocol).

So the service runs uvicorn's httptools protocol with four additions, each a
few lines on the protocol's own callbacks, on top of the bounds on pipelined
requests and unread answers of discovery/backpressure.py:

- a cap on open connections, from RLIMIT_NOFILE minus what the health
  engine's probes and the rest of the process need. A new connection at the
  cap pushes out the connection that has waited longest for a request (idle,
  or one half sent), as nginx reuses idle keep-alive connections when it runs
  out: so a flood of idle sockets cannot lock crawlers out. With none idle,
  it pushes out the one whose answers have waited longest for the client to
  read them, else one with pipelined requests queued (backpressure.py), so
  clients that never read, or that pipeline, cannot either. When every open
  connection is busy with one request, the new one gets `503 overloaded` and
  is closed at once, so it holds its descriptor for microseconds;
- a request deadline: a complete request, head and body, within
  REQUEST_TIMEOUT seconds of the connection opening or of the previous answer
  (uvicorn's keep-alive timeout still closes a connection idle between
  requests after KEEP_ALIVE seconds);
- a head size limit: a head over MAX_HEAD_BYTES gets 431 and the connection
  is closed (httptools accepts heads of any size). It holds for the whole
  head, whether it comes in one read or many: the request line and headers
  are counted as the parser hands them over (a complete head, in any number
  of reads), and the bytes of a head still incomplete after a read are
  counted too (httptools keeps a header to itself until it is complete);
- at a graceful stop, connections whose request has not fully arrived are
  closed at once (their handler sees a disconnect). Waiting for them would
  hold the stop until uvicorn's graceful timeout and then cancel their
  handlers, one logged traceback each.

Besides: at start the soft RLIMIT_NOFILE is raised towards the hard one
(`raise_fd_limit`), and should uvicorn still cancel handlers at a stop (a
request busy past the graceful timeout), its one line "Cancel N running
task(s)" is kept and the N CancelledError tracebacks are dropped
(`quiet_cancellations`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from discovery.backpressure import MAX_PIPELINED, WRITE_TIMEOUT, BackpressuredProtocol, reset
from discovery.logs import event

log = logging.getLogger("discovery.http")

REQUEST_TIMEOUT = 10.0  # seconds for a whole request (head and body) to arrive
KEEP_ALIVE = 5  # seconds a connection may idle between requests (uvicorn's timer)
MAX_HEAD_BYTES = 64 * 1024
# Descriptors kept for everything but client connections and probes: stdio,
# the listening socket, the event loop's own, the store (SQLite files, or the
# PostgreSQL pool), `pulumi` pipes, resolver threads' sockets, imports.
RESERVED_FDS = 128
MIN_CONNECTIONS = 16
# The soft limit is raised towards the hard one at start, but not past this:
# every connection also costs memory.
FD_LIMIT_TARGET = 65536
_WARN_EVERY_S = 10.0


def raise_fd_limit(target: int = FD_LIMIT_TARGET) -> tuple[int, int]:
    """Raises the soft RLIMIT_NOFILE to min(hard, target) if it is lower (systemd's
    default is 1,024 soft, 524,288 hard: the soft limit is low for select()'s sake,
    and the service polls with epoll). Returns the (soft, hard) limits in force, an
    unlimited one as `target`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return target, target
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft, target if hard == resource.RLIM_INFINITY else hard


def connection_cap(fd_limit: int, probe_workers: int) -> int:
    """Client connections the service accepts at once: the descriptor limit less one
    per probe in flight and RESERVED_FDS for the rest (at least MIN_CONNECTIONS)."""
    return max(MIN_CONNECTIONS, fd_limit - probe_workers - RESERVED_FDS)


@dataclass
class ConnectionGuard:
    """The limits and their counters, shared by every connection of one server."""

    max_connections: int
    registry: CollectorRegistry
    request_timeout: float = REQUEST_TIMEOUT
    max_head_bytes: int = MAX_HEAD_BYTES
    max_pipelined: int = MAX_PIPELINED
    write_timeout: float = WRITE_TIMEOUT
    connections: Collection[object] = field(default_factory=set)  # uvicorn's open connections
    # Connections waiting for a request (idle, or one half sent), the longest
    # waiting first: what a new connection pushes out at the cap.
    waiting: dict[object, asyncio.Transport] = field(default_factory=dict)
    # Connections whose answers wait for the client to read them, the longest
    # waiting first: pushed out at the cap when none is waiting for a request.
    stalled: dict[object, asyncio.Transport] = field(default_factory=dict)
    # Connections with requests queued behind the one being answered (pipelined),
    # the first queued first: pushed out at the cap after those.
    queued: dict[object, asyncio.Transport] = field(default_factory=dict)
    _since_warning: dict[str, int] = field(default_factory=dict)
    _warned_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.refused = Counter(
            "discovery_connections_refused",
            "Connections answered 503 and closed at once: at the cap, and every open "
            "connection busy with a request",
            registry=self.registry,
        )
        closed = Counter(
            "discovery_connections_closed",
            "Connections the service closed: request_timeout, head_too_large (before a "
            "complete request), evicted (the longest waiting, to make room for a new "
            "connection at the cap), write_timeout (answers left unread)",
            ["reason"],
            registry=self.registry,
        )
        self.timed_out = closed.labels(reason="request_timeout")
        self.head_too_large = closed.labels(reason="head_too_large")
        self.evicted = closed.labels(reason="evicted")
        self.unread = closed.labels(reason="write_timeout")
        Gauge(
            "discovery_connections_open",
            "Client connections open now",
            registry=self.registry,
        ).set_function(lambda: len(self.connections))
        Gauge(
            "discovery_connections_max",
            "The connection cap (from RLIMIT_NOFILE less what probes need)",
            registry=self.registry,
        ).set(self.max_connections)

    def make_room(self) -> bool:
        """At the cap: closes the connection that has waited longest for a request,
        else resets the one whose answers have waited longest, unread, else the one
        that queued requests first (False, and the caller refuses the new one, when
        every connection is busy with one request)."""
        while self.waiting:
            transport = self._take(self.waiting)
            if not transport.is_closing():
                # Its last answer may still wait for the client to read it: then a
                # close would wait for it to be flushed, maybe for ever.
                if transport.get_write_buffer_size():
                    reset(transport)
                else:
                    transport.close()
                return self._evicted()
        for heavy in (self.stalled, self.queued):
            if heavy:
                reset(self._take(heavy))
                return self._evicted()
        self.refused.inc()
        self._note("refused")
        return False

    def _take(self, pool: dict[object, asyncio.Transport]) -> asyncio.Transport:
        """The first connection of `pool`, out of every pool (one may be in several)."""
        owner = next(iter(pool))
        transport = pool[owner]
        for each in (self.waiting, self.stalled, self.queued):
            each.pop(owner, None)
        return transport

    def _evicted(self) -> bool:
        self.evicted.inc()
        self._note("evicted")
        return True

    def write_timed_out(self) -> None:
        self.unread.inc()

    def _note(self, what: str) -> None:
        self._since_warning[what] = self._since_warning.get(what, 0) + 1
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            event(
                log,
                logging.WARNING,
                "connection cap reached",
                max_connections=self.max_connections,
                evicted=self._since_warning.get("evicted", 0),
                refused=self._since_warning.get("refused", 0),
            )
            self._warned_at = now
            self._since_warning.clear()


def _answer(status: bytes, code: str, detail: str, extra: bytes = b"") -> bytes:
    body = b'{"error": "%s", "detail": "%s"}' % (code.encode(), detail.encode())
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n" % (status, len(body), extra)
    ) + body


_OVERLOADED = _answer(
    b"503 Service Unavailable",
    "overloaded",
    "too many connections busy; try again",
    b"retry-after: 1\r\n",
)
# "GET " and " HTTP/1.1\r\n" around the URL; the blank line that ends the head.
_REQUEST_LINE_BYTES = len(b"GET  HTTP/1.1\r\n\r\n")
_HEAD_TOO_LARGE = _answer(
    b"431 Request Header Fields Too Large",
    "bad_request",
    f"request heads are limited to {MAX_HEAD_BYTES} bytes",
)


def protocol_class(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `guard`'s limits (pass it as `http=` to uvicorn.Config)."""

    class GuardedProtocol(BackpressuredProtocol):
        limits = guard
        _deadline: asyncio.TimerHandle | None = None  # armed while waiting for a request
        _refused = False
        _rejected = False  # answered 431: what else arrives is ignored
        _in_head = True
        _head_bytes = 0  # bytes read while this head was incomplete
        _head_parsed = 0  # the request line's and headers' bytes the parser handed over
        _heads = 0  # heads completed on this connection

        def connection_made(  # type: ignore[override]  # as uvicorn's
            self, transport: asyncio.Transport
        ) -> None:
            guard.connections = self.connections
            if len(self.connections) >= guard.max_connections and not guard.make_room():
                self._refused = True
                self.transport = transport
                transport.write(_OVERLOADED)
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._refused:
                return
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused or self._rejected or self.transport.is_closing():
                return
            super().data_received(data)

        def _feed(self, data: bytes | memoryview) -> None:
            in_head, heads = self._in_head, self._heads
            super()._feed(data)  # type: ignore[arg-type]  # httptools takes a memoryview
            if in_head and self._in_head and heads == self._heads and not self._rejected:
                # The whole piece belongs to a head that is still incomplete.
                self._head_bytes += len(data)
                if self._head_bytes > guard.max_head_bytes:
                    self._reject_head()

        # Every parser callback is ignored once the head is refused: the rest
        # of the read is parsed still, but no request of it reaches the app.

        def on_message_begin(self) -> None:
            if self._rejected:
                return
            super().on_message_begin()
            self._head_parsed = _REQUEST_LINE_BYTES
            self._arm()

        def on_url(self, url: bytes) -> None:
            if not self._rejected and self._count(len(url)):
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            # name: value CRLF
            if not self._rejected and self._count(len(name) + len(value) + 4):
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._rejected:
                return
            self._in_head = False
            self._heads += 1
            self._head_bytes = 0
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._rejected:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._rejected:
                return
            super().on_message_complete()
            self._disarm()
            self._in_head = True  # what comes next is the next request's head

        def _count(self, size: int) -> bool:
            """Adds `size` bytes to the head; False (and 431) past the limit."""
            self._head_parsed += size
            if self._head_parsed > guard.max_head_bytes:
                self._reject_head()
                return False
            return True

        def _reject_head(self) -> None:
            self._rejected = True
            self._disarm()
            if not self.transport.is_closing():
                guard.head_too_large.inc()
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()
                self._linger()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle.response_complete:
                self._arm()  # waiting for the next request

        def shutdown(self) -> None:
            cycle = self.cycle
            if cycle is not None and cycle.more_body and not cycle.response_started:
                # Half a request: it cannot be answered before we stop.
                self.transport.close()
                return
            super().shutdown()

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(guard.request_timeout, self._timed_out)
                guard.waiting[self] = self.transport

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
                guard.waiting.pop(self, None)

        def _timed_out(self) -> None:
            self._deadline = None
            guard.waiting.pop(self, None)
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not cycle.response_complete:
                # A complete request is being answered (a pipelined one is late):
                # finish the answer, then close.
                cycle.keep_alive = False
                return
            guard.timed_out.inc()
            self.transport.close()
            self._linger()

    return GuardedProtocol


class _NoCancelledTracebacks(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" records for handlers it cancelled
    itself (at a stop, after the graceful timeout): its one line "Cancel N running
    task(s)" already says it, and N tracebacks of CancelledError say nothing more."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, asyncio.CancelledError)


def quiet_cancellations(logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoCancelledTracebacks) for f in target.filters):
        target.addFilter(_NoCancelledTracebacks())
