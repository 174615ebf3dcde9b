"""The fleet status page: `GET /ui/` and what it needs, served by the service itself.

The page is hand-written HTML, CSS and JavaScript shipped in the package
(discovery/static/); no build step, nothing from a CDN. Its data comes from
`GET /ui/api/status` (discovery/status.py), one request per refresh.

Access. With a token configured, the page asks for it once (a login form,
POSTed, never in a URL) and answers with a session cookie: HttpOnly,
SameSite=Strict, scoped to Path=/ui, holding an expiry and an HMAC of it keyed
by the token (not the token itself; it ends when the token changes). The
cookie is accepted only by the page and its read-only data endpoint: the
browser never sends it to /v1/*, and BearerAuth reads no cookie, so a page
of another site cannot make a logged-in browser grant, report or release a
lease (CSRF). `/ui/api/status` also takes the API's bearer header. Without a
token (a service on loopback) the page needs no login.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from pydantic_core import to_json
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from discovery.middleware import bearer_matches, token_digest, token_matches
from discovery.status import BadQuery, StatusQuery, fleet_status

COOKIE = "discovery_session"
COOKIE_PATH = "/ui"
SESSION_S = 12 * 3600
MAX_FORM_BYTES = 4096
_STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}

ProxiesFn = Callable[[], Awaitable[list[dict[str, Any]]]]


def _asset(name: str) -> bytes:
    return resources.files("discovery").joinpath("static", name).read_bytes()


class Sessions:
    """Checks the token and the session cookies derived from it."""

    def __init__(self, token: str | None, clock: Callable[[], float] = time.time) -> None:
        self.required = bool(token)
        self._digest = token_digest(token) if token else b""
        self._key = hashlib.sha256(b"discovery-ui-session\0" + self._digest).digest()
        self._clock = clock

    def token_ok(self, given: str) -> bool:
        """The login form's token, compared as the API's bearer token is."""
        return token_matches(given.encode(), self._digest)

    def new_cookie(self) -> str:
        expires = int(self._clock()) + SESSION_S
        return f"{expires}.{self._mac(expires)}"

    def cookie_ok(self, value: str | None) -> bool:
        if value is None:
            return False
        expires, _, mac = value.partition(".")
        if not expires.isdigit() or int(expires) <= self._clock():
            return False
        return hmac.compare_digest(mac.encode(), self._mac(int(expires)).encode())

    def _mac(self, expires: int) -> str:
        return hmac.new(self._key, str(expires).encode(), hashlib.sha256).hexdigest()

    def allowed(self, request: Request, *, bearer: bool = False) -> bool:
        """Whether the request may see the page (`bearer`: or carries the API's header)."""
        if not self.required:
            return True
        if self.cookie_ok(request.cookies.get(COOKIE)):
            return True
        if bearer:
            header = request.headers.get("authorization")
            return header is not None and bearer_matches(header.encode("latin-1"), self._digest)
        return False


def ui_routes(
    proxies: ProxiesFn,
    sessions: Sessions,
    *,
    grants_last_minute: Callable[[], int],
    clock: Callable[[], float] = time.time,
) -> list[Route]:
    """The page's routes; `proxies` is the lease book's `proxies_json(detail=True)`."""
    page = _asset("index.html")
    login = _asset("login.html").decode()
    static = {name: _asset(name) for name in _STATIC}

    def html(body: bytes | str, status: int = 200) -> Response:
        return Response(body, status, _HEADERS, media_type="text/html")

    def login_page(message: str = "", status: int = 401) -> Response:
        # `message` is one of this module's fixed texts: nothing a client sent is echoed.
        return html(login.replace("<!--message-->", message), status)

    async def root(request: Request) -> Response:
        return RedirectResponse("/ui/", 303)

    async def index(request: Request) -> Response:
        if not sessions.allowed(request):
            return login_page()
        return html(page)

    async def do_login(request: Request) -> Response:
        if not sessions.required:
            return RedirectResponse("/ui/", 303)
        body = await request.body()
        fields = parse_qs(body[:MAX_FORM_BYTES].decode(errors="replace"), max_num_fields=4)
        given = (fields.get("token") or [""])[0]
        if not given or not sessions.token_ok(given):
            return login_page('<p class="error" role="alert">Wrong token.</p>')
        answer = RedirectResponse("/ui/", 303, headers={"Cache-Control": "no-store"})
        answer.set_cookie(
            COOKIE,
            sessions.new_cookie(),
            max_age=SESSION_S,
            path=COOKIE_PATH,
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return answer

    async def do_logout(request: Request) -> Response:
        answer = RedirectResponse("/ui/", 303)
        answer.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
        return answer

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            return Response(b"not found", 404, media_type="text/plain")
        return Response(static[name], 200, _HEADERS, media_type=_STATIC[name])

    async def status(request: Request) -> Response:
        headers = {"Cache-Control": "no-store"}
        if not sessions.allowed(request, bearer=True):
            return _json({"error": "unauthorized", "detail": "log in first"}, 401, headers)
        try:
            query = StatusQuery.parse(request.query_params)
        except BadQuery as exc:
            return _json({"error": "bad_request", "detail": str(exc)}, 400, headers)
        answer = fleet_status(
            await proxies(), query, now=clock(), grants_last_minute=grants_last_minute()
        )
        return _json(answer, 200, headers)

    return [
        Route("/", root, methods=["GET"]),
        Route("/ui", root, methods=["GET"]),
        Route("/ui/", index, methods=["GET"]),
        Route("/ui/login", do_login, methods=["POST"]),
        Route("/ui/logout", do_logout, methods=["POST"]),
        Route("/ui/static/{name}", asset, methods=["GET"]),
        Route("/ui/api/status", status, methods=["GET"]),
    ]


def _json(content: Any, status: int, headers: dict[str, str]) -> Response:
    return Response(to_json(content), status, headers, media_type="application/json")
