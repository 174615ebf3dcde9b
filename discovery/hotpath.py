"""The lease routes and /healthz as one plain ASGI layer in front of Starlette.

These are the requests a crawler fleet sends all the time, so they skip
Starlette's per-request machinery (router scan, Request and Response objects,
two exception-handling layers): the path is matched with a few string
tests, the body parsed by the same pydantic models (schemas.py) and the
answer written as two ASGI messages. Everything else (`/v1/proxies`,
`/readyz`, `/metrics`, `/openapi.json`, unknown paths) goes on to Starlette.
Answers, errors included, are the same as the documented API's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

from discovery.book.contract import LeaseBook
from discovery.book.views import lease_json
from discovery.http_errors import BadInput, error_answer
from discovery.schemas import LeaseRequest, RenewRequest, ReportRequest
from discovery.selection import Selector
from discovery.targets import host_of

log = logging.getLogger("discovery.http")

M = TypeVar("M", bound=BaseModel)
LEASES = "/v1/leases"
_JSON = (b"content-type", b"application/json")
_NO_SELECTOR = Selector()


class _WrongMethod(Exception):
    def __init__(self, allow: str) -> None:
        self.allow = allow


@dataclass(frozen=True)
class Template:
    """What RequestMetrics reads from scope["route"]: the path template."""

    path: str


GRANT, LEASE, RENEW, REPORT, HEALTHZ = (
    Template(LEASES),
    Template(LEASES + "/{lease_id}"),
    Template(LEASES + "/{lease_id}/renew"),
    Template(LEASES + "/{lease_id}/report"),
    Template("/healthz"),
)
_METHODS = {GRANT: "POST", LEASE: "DELETE", RENEW: "POST", REPORT: "POST", HEALTHZ: "GET"}

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


# A location part shown as it is: a field name, an index, pydantic's "[key]".
# Anything else is a key the client sent (a label's), shown as "…": inputs are
# echoed nowhere, not even as a location (a NUL, a password pasted as a key).
_SHOWN = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}|\[key\]")


def describe(exc: ValidationError) -> str:
    """Locations and messages only: inputs are echoed nowhere."""
    problems = []
    for item in exc.errors(include_input=False, include_url=False)[:10]:
        parts = [str(p) if isinstance(p, int) or _SHOWN.fullmatch(p) else "…" for p in item["loc"]]
        where = ".".join(parts) or "body"
        problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


def parse(raw: bytes, model: type[M], *, optional: bool = False) -> M:
    if not raw.strip():
        if optional:
            return model()
        raise BadInput("a JSON body is required")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise BadInput(describe(exc)) from None


def host(target: str | None) -> str | None:
    if target is None:
        return None
    try:
        return host_of(target)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def match(path: str) -> tuple[Template | None, str]:
    """The route template of a hot path and its lease id ('' for none)."""
    if path == LEASES:
        return GRANT, ""
    if path == "/healthz":
        return HEALTHZ, ""
    if not path.startswith(LEASES + "/"):
        return None, ""
    rest = path[len(LEASES) + 1 :]
    lease_id, _, action = rest.partition("/")
    if not lease_id:
        return None, ""
    if not action:
        return LEASE, lease_id
    if action == "renew":
        return RENEW, lease_id
    if action == "report":
        return REPORT, lease_id
    return None, ""


class HotPath:
    """ASGI: the hot routes answered here, the rest passed to `app`.
    `book` is called per request (the book exists once the service started)."""

    def __init__(self, app: ASGIApp, book: Callable[[], LeaseBook]) -> None:
        self.app = app
        self._book = book
        self._handlers: dict[Template, Callable[[str, bytes], Awaitable[Answer]]] = {
            GRANT: self._grant,
            LEASE: self._release,
            RENEW: self._renew,
            REPORT: self._report,
            HEALTHZ: self._healthz,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, lease_id = match(scope["path"])
        if route is None:
            await self.app(scope, receive, send)  # Starlette: the other routes, 404
            return
        scope["route"] = route
        allowed = _METHODS[route]
        try:
            if scope["method"] != allowed:
                raise _WrongMethod(allowed)
            body = await _body(receive) if scope["method"] == "POST" else b""
            status, content, headers = await self._handlers[route](lease_id, body)
        except _WrongMethod as exc:
            status, content = 405, _error_body("method_not_allowed", "Method Not Allowed")
            headers = [(b"allow", exc.allow.encode())]
        except Exception as exc:
            answer = error_answer(exc)
            status, content = answer.status, _error_body(answer.code, answer.detail)
            headers = [(k.lower().encode(), v.encode()) for k, v in answer.headers.items()]
        head = headers
        if status != 204:  # a 204 has neither body nor length (RFC 9110)
            head = [_JSON, (b"content-length", str(len(content)).encode()), *headers]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": content})

    async def _grant(self, _lease_id: str, body: bytes) -> Answer:
        request = parse(body, LeaseRequest)
        selector = _NO_SELECTOR
        if request.selector is not None:
            wanted = request.selector
            selector = Selector(wanted.provider, wanted.zone, wanted.labels)
        book = self._book()
        lease = await book.grant(
            request.holder, ttl=request.ttl_seconds, selector=selector, host=host(request.target)
        )
        return 201, to_json(lease_json(lease)), []

    async def _renew(self, lease_id: str, body: bytes) -> Answer:
        request = parse(body, RenewRequest, optional=True)
        lease = await self._book().renew(lease_id, ttl=request.ttl_seconds)
        return 200, to_json(lease_json(lease)), []

    async def _report(self, lease_id: str, body: bytes) -> Answer:
        request = parse(body, ReportRequest)
        await self._book().report(lease_id, request.outcome, host=host(request.target))
        return 204, b"", []

    async def _release(self, lease_id: str, _body: bytes) -> Answer:
        await self._book().release(lease_id)
        return 204, b"", []

    async def _healthz(self, _lease_id: str, _body: bytes) -> Answer:
        return 200, b'{"status":"ok"}', []


def _error_body(code: str, detail: str) -> bytes:
    return to_json({"error": code, "detail": detail})


async def _body(receive: Receive) -> bytes:
    """The whole request body (BodyLimit has bounded and buffered it)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


__all__ = ["HotPath", "describe", "host", "match", "parse"]
