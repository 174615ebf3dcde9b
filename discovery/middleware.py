"""ASGI layers around the API: request metrics, bearer auth (braked against
guessing, discovery/brake.py), body size limit.

Plain ASGI rather than Starlette's BaseHTTPMiddleware: these run on every
request, and BaseHTTPMiddleware's extra task and stream per request cost
more than the lease logic itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from discovery.brake import Brake, scope_address
from discovery.logs import event
from discovery.metrics import UNMATCHED, method_label

log = logging.getLogger("discovery.http")

MAX_BODY_BYTES = 64 * 1024


async def send_error(
    send: Send,
    status: int,
    code: str,
    detail: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps({"error": code, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestMetrics:
    """Times every request into a histogram labelled by method, route template
    and status, each from a fixed set (metrics.method_label: an unknown method
    is `other`; the template, never the raw path, else `unmatched`; the status
    the app answered): no client can add series to /metrics."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self._histogram = histogram
        self._children: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", UNMATCHED)
            key = (method_label(scope["method"]), route, status)
            child = self._children.get(key)
            if child is None:
                child = self._histogram.labels(*map(str, key))
                self._children[key] = child
            child.observe(elapsed)
            event(
                log,
                logging.DEBUG,
                "request",
                method=scope["method"],
                route=route,
                status=status,
                ms=round(elapsed * 1000, 3),
            )


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_matches(given: bytes, digest: bytes) -> bool:
    """Both sides are hashed before the constant-time comparison so that not
    even the token's length leaks through timing."""
    return hmac.compare_digest(hashlib.sha256(given).digest(), digest)


def bearer_matches(authorization: bytes, digest: bytes) -> bool:
    """Whether an `Authorization` header's value is `Bearer <the token>`."""
    scheme, _, credentials = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and token_matches(credentials.strip(), digest)


_CHALLENGE = [(b"www-authenticate", b'Bearer realm="discovery"')]


class BearerAuth:
    """`Authorization: Bearer <token>` on /v1/* when a token is configured.
    Wrong tokens are braked per client address (`brake`; share one with the
    status page's Sessions so that both count against the same address)."""

    def __init__(self, app: ASGIApp, token: str | None, brake: Brake | None = None) -> None:
        self.app = app
        self._digest = token_digest(token) if token else None
        self.brake = brake if brake is not None else Brake()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._digest is not None
            and scope["type"] == "http"
            and (scope["path"] == "/v1" or scope["path"].startswith("/v1/"))
        ):
            refusal = self._refusal(scope)
            if refusal is not None:
                await send_error(send, *refusal)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str, list[tuple[bytes, bytes]]] | None:
        """None when the token is right; else the error to answer (401 or 429)."""
        assert self._digest is not None
        header = next((v for n, v in scope["headers"] if n == b"authorization"), None)
        if header is not None:
            address = scope_address(scope)
            wait = self.brake.retry_after(address)
            if wait:
                detail = self.brake.refusal_detail(address, wait)
                return 429, "too_many_requests", detail, [(b"retry-after", b"%d" % wait)]
            if bearer_matches(header, self._digest):
                self.brake.succeeded(address)
                return None
            self.brake.failed(address, "bearer")
        # No header is no guess: it is not counted.
        return 401, "unauthorized", "missing or wrong bearer token", _CHALLENGE


class BodyLimit:
    """Refuses request bodies over `limit` bytes with 413, before any of it is parsed."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    await send_error(send, 400, "bad_request", "invalid Content-Length")
                    return
                if int(value) > self.limit:
                    await self._too_large(send)
                    return
        # Read the whole (bounded) body now; chunked uploads have no length up front.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await send_error(
            send, 413, "payload_too_large", f"request bodies are limited to {self.limit} bytes"
        )
