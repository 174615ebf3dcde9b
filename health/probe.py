"""One CONNECT probe of one proxy, classified and timed.

A probe opens a TCP connection to the proxy, sends `CONNECT target HTTP/1.1`
(with Proxy-Authorization: Basic when the proxy has credentials) and passes on
a 2xx answer; optionally it then runs a TLS handshake with the target through
the tunnel.  Connect, CONNECT answer and TLS are timed separately.

The exchange runs on a non-blocking socket driven by the event loop's
reader/writer callbacks (no thread, no transport); only a TLS handshake hands
the socket to an asyncio SSL transport.  `timeout` bounds the whole probe,
not each phase, so a proxy that accepts but never answers costs at most
`timeout` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import functools
import os
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from health.model import Outcome, ProxyEndpoint

# A CONNECT answer is a status line and a few headers; squid's 407 carries a
# realm and an error page body after the head, which is never read.
MAX_HEAD_BYTES = 16 * 1024

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9]{2})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?")
# host:port with a DNS name, an IPv4 address or a bracketed IPv6 address; no
# spaces or control characters, so nothing can be injected into the request.
_TARGET = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
_SQUID_ERROR = re.compile(rb"\r\nX-Squid-Error: ([^\r\n]{1,200})", re.IGNORECASE)
_UPSTREAM_STATUSES = frozenset({502, 503, 504})
_HTTP_PREFIX = b"HTTP/"
_IN_PROGRESS = frozenset({errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK})
# This process's or the machine's shortage, not the proxy's (Outcome.LOCAL).
_LOCAL_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_NOTHING, _READABLE, _WRITABLE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """How one probe ended; times in milliseconds, None for phases not reached."""

    outcome: Outcome
    connect_ms: float | None
    answer_ms: float | None
    tls_ms: float | None
    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def total_ms(self) -> float | None:
        """Connect + CONNECT answer (+ TLS): what a crawler waits for a tunnel."""
        if self.connect_ms is None or self.answer_ms is None:
            return None
        return self.connect_ms + self.answer_ms + (self.tls_ms or 0.0)


class ProbeFn(Protocol):
    """What the engine calls; `probe` below, or a fake in tests."""

    def __call__(
        self,
        endpoint: ProxyEndpoint,
        target: str,
        *,
        timeout: float,
        tls: bool,
        ca_file: str | None,
    ) -> Awaitable[ProbeResult]: ...


class MalformedAnswer(Exception):
    """The proxy answered something that is not an HTTP/1.x status line."""


class _ClosedEarly(Exception):
    """The proxy closed the connection before a complete answer head."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


def check_target(target: str) -> tuple[str, int]:
    """`host:port` -> (host without brackets, port); ValueError otherwise."""
    match = _TARGET.fullmatch(target) if isinstance(target, str) else None
    port = int(match.group(2)) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise ValueError(f"probe target {target!r} is not host:port (e.g. example.com:443)")
    return match.group(1).strip("[]"), port


def connect_request(target: str, username: str | None, password: str | None) -> bytes:
    """The CONNECT request bytes, with Basic credentials when a username is set."""
    check_target(target)
    lines = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if username is not None:
        # RFC 7617: user-pass in UTF-8; squid's helper gets the same bytes.
        token = base64.b64encode(f"{username}:{password or ''}".encode()).decode("ascii")
        lines += f"Proxy-Authorization: Basic {token}\r\n"
    return (lines + "\r\n").encode("ascii")


def parse_status(head: bytes) -> tuple[int, str]:
    """(status, status line as text) of an answer head; MalformedAnswer otherwise."""
    line = head.split(b"\r\n", 1)[0]
    match = _STATUS_LINE.fullmatch(line)
    if match is None:
        raise MalformedAnswer(f"not an HTTP status line: {_shown(line)}")
    return int(match.group(1)), line.decode("latin-1")


def classify(status: int) -> Outcome:
    if 200 <= status <= 299:
        return Outcome.OK
    if status == 407:
        return Outcome.AUTH_REQUIRED
    if status == 403:
        return Outcome.DENIED
    if status in _UPSTREAM_STATUSES:
        return Outcome.UPSTREAM
    return Outcome.ERROR


def _shown(data: bytes | bytearray, limit: int = 60) -> str:
    """Peer bytes made safe for a log line or an API field."""
    text = data[:limit].decode("latin-1")
    text = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in text)
    return '"' + text + ('..."' if len(data) > limit else '"')


class _Exchange:
    """Connect, send the request, read the answer head: one non-blocking
    socket driven by the loop's reader/writer callbacks, resolving `head`.

    Why not `loop.create_connection` and a Protocol: per probe, the transport
    machinery costs about half again as much CPU as these few callbacks
    (measured with bench/health_probes.py), and a probe needs none of it.
    The socket is watched for one thing at a time and every selector call
    is one that changes something: asyncio's remove_* of an fd that is not
    registered builds (and drops) a KeyError message each time.
    Garbage is recognised at its first bytes, not at the timeout: an answer
    must start with "HTTP/".
    """

    __slots__ = (
        "_buffer",
        "_fd",
        "_loop",
        "_pending",
        "_watching",
        "answered_at",
        "connected_at",
        "head",
        "sent_at",
        "sock",
        "started",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, family: int, request: bytes) -> None:
        self._loop = loop
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self._fd = self.sock.fileno()
        self._watching = _NOTHING
        self._pending = memoryview(request)
        self._buffer = bytearray()
        self.head: asyncio.Future[bytes] = loop.create_future()
        self.started = self.connected_at = self.sent_at = self.answered_at = 0.0

    # -- selector registration -------------------------------------------------

    def _watch(self, what: int, callback: Callable[[], None]) -> None:
        self._unwatch()
        if what == _WRITABLE:
            self._loop.add_writer(self._fd, callback)
        else:
            self._loop.add_reader(self._fd, callback)
        self._watching = what

    def _unwatch(self) -> None:
        if self._watching == _WRITABLE:
            self._loop.remove_writer(self._fd)
        elif self._watching == _READABLE:
            self._loop.remove_reader(self._fd)
        self._watching = _NOTHING

    # -- the exchange ----------------------------------------------------------

    def start(self, address: tuple[Any, ...]) -> None:
        self.started = time.perf_counter()
        error = self.sock.connect_ex(address)
        if error == 0:
            self._connected()
        elif error in _IN_PROGRESS:
            self._watch(_WRITABLE, self._on_connect)
        else:
            raise OSError(error, os.strerror(error))

    def _on_connect(self) -> None:
        if self.head.done():  # cancelled (timeout, stop) in this loop iteration
            self._unwatch()
            return
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            # OSError(errno, ...) is ConnectionRefusedError etc. by errno.
            self._fail(OSError(error, os.strerror(error)))
        else:
            self._connected()

    def _connected(self) -> None:
        self.connected_at = time.perf_counter()
        self._send()

    def _send(self) -> None:
        if self.head.done():
            self._unwatch()
            return
        try:
            sent = self.sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(exc)
            return
        self._pending = self._pending[sent:]
        if self._pending:  # a full send buffer on a fresh socket: rare
            if self._watching != _WRITABLE:
                self._watch(_WRITABLE, self._send)
            return
        self.sent_at = time.perf_counter()
        self._watch(_READABLE, self._on_readable)

    def _on_readable(self) -> None:
        if self.head.done():
            self._unwatch()
            return
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        if not data:
            self._fail(_ClosedEarly(len(self._buffer)))
            return
        buffer = self._buffer
        buffer += data
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            self._unwatch()
            self.answered_at = time.perf_counter()
            self.head.set_result(bytes(buffer[: end + 2]))
            return
        prefix = min(len(buffer), len(_HTTP_PREFIX))
        if buffer[:prefix] != _HTTP_PREFIX[:prefix]:
            self._fail(MalformedAnswer(f"answer is not HTTP: {_shown(buffer)}"))
        elif len(buffer) > MAX_HEAD_BYTES:
            self._fail(MalformedAnswer(f"answer head longer than {MAX_HEAD_BYTES} bytes"))

    def _fail(self, exc: BaseException) -> None:
        self._unwatch()
        if not self.head.done():
            self.head.set_exception(exc)

    def detach(self) -> socket.socket:
        """Stop watching the socket and hand it over (to a TLS transport)."""
        self._unwatch()
        # The new owner may close the socket at any time, and the kernel may
        # give its number to another probe's socket: never touch it again.
        self._fd = -1
        return self.sock

    def close(self) -> None:
        if self._fd >= 0:
            self._unwatch()
            self.sock.close()
        if not self.head.cancel() and not self.head.cancelled():
            self.head.exception()  # read, so asyncio does not log it as lost


@functools.lru_cache(maxsize=8)
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Verifying against `ca_file` (certificate and host name), else not at all.

    Cached: loading a CA bundle costs milliseconds, a probe must not.
    """
    if ca_file is not None:
        return ssl.create_default_context(cafile=ca_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _address(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> tuple[int, tuple[Any, ...]]:
    """(family, socket address): IP literals directly, names through the
    loop's resolver (its thread pool, shared; the first address is used)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, (host, port)
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise socket.gaierror(socket.EAI_NONAME, "no address")
    family, _, _, _, address = infos[0]
    return family, address


async def probe(
    endpoint: ProxyEndpoint,
    target: str,
    *,
    timeout: float = 5.0,
    tls: bool = False,
    ca_file: str | None = None,
    server_hostname: str | None = None,
) -> ProbeResult:
    """Probe one proxy with `CONNECT target`; never raises for network trouble.

    `server_hostname` (SNI and the name checked against the certificate)
    defaults to the target's host.  ValueError for a malformed target.
    """
    request = connect_request(target, endpoint.username, endpoint.password)
    loop = asyncio.get_running_loop()
    phase = "connect"
    exchange: _Exchange | None = None
    tunnel: asyncio.Transport | None = None
    connect_ms: float | None = None
    answer_ms: float | None = None
    tls_ms: float | None = None
    status: int | None = None

    def result(outcome: Outcome, error: str | None) -> ProbeResult:
        return ProbeResult(outcome, connect_ms, answer_ms, tls_ms, status, error)

    try:
        async with asyncio.timeout(timeout):
            family, address = await _address(loop, endpoint.host, endpoint.port)
            exchange = _Exchange(loop, family, request)
            exchange.start(address)
            try:
                head = await exchange.head
            finally:
                if exchange.connected_at:
                    connect_ms = (exchange.connected_at - exchange.started) * 1000.0
                    phase = "answer"
            answer_ms = (exchange.answered_at - exchange.sent_at) * 1000.0
            status, status_line = parse_status(head)
            outcome = classify(status)
            if outcome is not Outcome.OK:
                return result(outcome, _status_error(status_line, head))
            if tls:
                phase = "tls"
                started = time.perf_counter()
                tunnel, _ = await loop.create_connection(
                    asyncio.Protocol,
                    sock=exchange.detach(),
                    ssl=tls_context(ca_file),
                    server_hostname=server_hostname or check_target(target)[0],
                    ssl_handshake_timeout=timeout,
                )
                tls_ms = (time.perf_counter() - started) * 1000.0
            return result(Outcome.OK, None)
    except TimeoutError:
        return result(Outcome.TIMEOUT, f"no {_PHASE_NAMES[phase]} in {timeout:g} s")
    except MalformedAnswer as exc:
        return result(Outcome.MALFORMED, str(exc))
    except (OSError, _ClosedEarly) as exc:
        return result(*_network_failure(phase, endpoint, exc))
    finally:
        # The TLS transport owns the socket once made; a probe has nothing
        # more to say, so no close_notify exchange: abort.
        if tunnel is not None:
            tunnel.abort()
        if exchange is not None:
            exchange.close()


_PHASE_NAMES = {
    "connect": "TCP connection",
    "answer": "answer to CONNECT",
    "tls": "TLS handshake through the tunnel",
}


def _status_error(status_line: str, head: bytes) -> str:
    # squid names its reason (ERR_CONNECT_FAIL 111, ERR_ACCESS_DENIED, ...).
    detail = _SQUID_ERROR.search(head)
    suffix = f" ({detail.group(1).decode('latin-1')})" if detail else ""
    return f"proxy answered {_shown(status_line.encode('latin-1'), 100)}{suffix}"


def _network_failure(
    phase: str, endpoint: ProxyEndpoint, exc: BaseException
) -> tuple[Outcome, str]:
    where = f"{endpoint.host}:{endpoint.port}"
    if (
        isinstance(exc, OSError)
        and not isinstance(exc, ssl.SSLError | socket.gaierror)  # errno: their own codes
        and exc.errno in _LOCAL_SHORTAGE
    ):
        return Outcome.LOCAL, f"the prober is short of resources: {exc.strerror}"
    if phase == "tls":
        # The proxy did its part; the target (or what sits in the tunnel) did not.
        return Outcome.TLS, f"TLS handshake through the tunnel failed: {exc}"
    if isinstance(exc, ConnectionRefusedError):
        return Outcome.REFUSED, f"connection refused by {where}"
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return Outcome.RESET, f"connection reset by {where}"
    if isinstance(exc, _ClosedEarly):
        if exc.received == 0:
            return Outcome.RESET, f"{where} closed the connection without answering"
        return (
            Outcome.MALFORMED,
            f"{where} closed the connection after {exc.received} bytes of head",
        )
    if isinstance(exc, socket.gaierror):
        return Outcome.ERROR, f"cannot resolve {endpoint.host}: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return Outcome.ERROR, f"{where}: {exc.strerror}"
    return Outcome.ERROR, f"{where}: {exc!r}"
