"""HTTP/1.1 on the gateway's two sides: request heads from clients (parsed by
httptools, the C parser uvicorn uses), what is sent on to a leased squid, and
the gateway's own answers.

The gateway forwards what it is given but never the headers that belong to
one hop (RFC 9110 7.6.1): the client's `Proxy-Authorization` (its token) and
`Connection` options stop here, and the squid's credentials are added only on
the way to the squid.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Headers = list[tuple[bytes, bytes]]

# Hop-by-hop headers (and the proxy ones), never forwarded in either direction.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
    }
)
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"DELETE", b"PUT", b"TRACE"})

# Why a refusal happened, in the `Egress-Gateway-Reason` header of the gateway's
# own answers (the body says the same in one line).
REASON_HEADER = b"egress-gateway-reason"


@dataclass
class RequestHead:
    """One request as the client sent it (header names lower-cased)."""

    method: bytes
    target: bytes  # `host:port` for CONNECT, an absolute URL otherwise
    version: str  # "1.1" or "1.0"
    headers: Headers = field(default_factory=list)
    keep_alive: bool = True
    body: bytes = b""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def has_body(self) -> bool:
        return bool(self.body) or self.header(b"content-length") not in (None, b"0")

    @property
    def retryable(self) -> bool:
        """An idempotent request without a body may go out twice."""
        return self.method in IDEMPOTENT and not self.body and not self.chunked

    @property
    def chunked(self) -> bool:
        value = self.header(b"transfer-encoding")
        return value is not None and b"chunked" in value.lower()


def connection_options(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """The header names a `Connection` header lists (they are hop-by-hop too)."""
    names: set[bytes] = set()
    for key, value in headers:
        if key == b"connection":
            names.update(part.strip().lower() for part in value.split(b","))
    return names


def end_to_end(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    """`headers` without the hop-by-hop ones (and those `Connection` names)."""
    listed = connection_options(headers)
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in listed]


def basic_credentials(username: str | None, password: str | None) -> bytes | None:
    """The `Proxy-Authorization` value for a squid's credentials (None without)."""
    if username is None:
        return None
    raw = f"{username}:{password or ''}".encode()
    return b"Basic " + base64.b64encode(raw)


def authority(host: str, port: int) -> bytes:
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}".encode("ascii")


def connect_request(target: bytes, credentials: bytes | None) -> bytes:
    """CONNECT `target` through a squid, with its credentials."""
    head = b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (target, target)
    if credentials is not None:
        head += b"Proxy-Authorization: %s\r\n" % credentials
    return head + b"\r\n"


def forward_request(request: RequestHead, url: bytes, credentials: bytes | None) -> bytes:
    """An absolute-form request for a squid: the client's end-to-end headers, a
    body length of our own (the body is whole), the squid's credentials."""
    lines = [b"%s %s HTTP/1.1" % (request.method, url)]
    lines += [
        b"%s: %s" % pair for pair in end_to_end(request.headers) if pair[0] != b"content-length"
    ]
    if request.body or request.method in (b"POST", b"PUT", b"PATCH"):
        lines.append(b"content-length: %d" % len(request.body))
    if credentials is not None:
        lines.append(b"proxy-authorization: " + credentials)
    lines.append(b"connection: keep-alive")
    return b"\r\n".join(lines) + b"\r\n\r\n" + request.body


def response_head(
    status: int,
    reason: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    framing: bytes,
    close: bool,
) -> bytes:
    """A squid's answer head as the client gets it: end-to-end headers, our
    framing (`framing` is a header line, or b"" for a body that has none)."""
    lines = [b"HTTP/1.1 %d %s" % (status, reason or b"-")]
    lines += [b"%s: %s" % pair for pair in end_to_end(headers) if pair[0] != b"content-length"]
    if framing:
        lines.append(framing)
    lines.append(b"connection: close" if close else b"connection: keep-alive")
    return b"\r\n".join(lines) + b"\r\n\r\n"


_REASONS = {
    200: b"Connection established",
    400: b"Bad Request",
    403: b"Forbidden",
    405: b"Method Not Allowed",
    407: b"Proxy Authentication Required",
    408: b"Request Timeout",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


def answer(
    status: int,
    reason: str,
    detail: str,
    *,
    extra: Sequence[tuple[bytes, bytes]] = (),
    close: bool = False,
) -> bytes:
    """The gateway's own answer: `reason` (a word) in the reason header, and
    one line of text that says what happened."""
    body = f"{detail}\n".encode()
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Error"))]
    lines.append(REASON_HEADER + b": " + reason.encode())
    lines += [b"%s: %s" % pair for pair in extra]
    lines.append(b"content-type: text/plain; charset=utf-8")
    lines.append(b"content-length: %d" % len(body))
    if close:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


TUNNEL_OPEN = b"HTTP/1.1 200 Connection established\r\n\r\n"


def parse_status_line(head: bytes) -> tuple[int, bytes]:
    """(status, reason) of a squid's answer head; ValueError when it is none."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError("not an HTTP status line")
    return int(parts[1]), parts[2] if len(parts) > 2 else b""


def head_headers(head: bytes) -> Headers:
    """The header lines of an answer head, names lower-cased."""
    headers = []
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers.append((name.strip().lower(), value.strip()))
    return headers


__all__ = [
    "HOP_BY_HOP",
    "REASON_HEADER",
    "TUNNEL_OPEN",
    "Headers",
    "RequestHead",
    "answer",
    "authority",
    "basic_credentials",
    "connect_request",
    "end_to_end",
    "forward_request",
    "head_headers",
    "parse_status_line",
    "response_head",
]
