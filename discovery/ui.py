"""The fleet status page: `GET /ui/` and what it needs, served by the service itself.

The page is hand-written HTML, CSS and JavaScript shipped in the package
(discovery/static/); no build step, nothing from a CDN. Its data comes from
`GET /ui/api/status` (discovery/status.py), one request per refresh.

Access. With a token configured, the page asks for it once (a login form,
POSTed, never in a URL) and answers with a session cookie: HttpOnly,
SameSite=Strict, scoped to Path=/ui, holding an expiry, a random nonce and an
HMAC of both keyed by the token (not the token itself; it ends when the token
changes). The cookie is accepted only by the page and its read-only data
endpoint: the browser never sends it to /v1/*, and BearerAuth reads no
cookie, so a page of another site cannot make a logged-in browser grant,
report or release a lease (CSRF). `/ui/api/status` also takes the API's
bearer header. Without a token (a service on loopback) the page needs no
login. Wrong tokens are braked per client address (discovery/brake.py): the
header's on the API's brake, the form's on a brake of its own, so that wrong
logins never slow a crawler's bearer token. The form and the logout take no
POST from another site's page (`cross_site`: by `Sec-Fetch-Site`, else by
`Origin`): no other site can guess through a visitor's browser or log it
out. Logging out revokes the cookie in this
process's memory until it would have expired.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import html as markup
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic_core import to_json
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from discovery.brake import Brake
from discovery.middleware import bearer_matches, token_digest, token_matches
from discovery.status import BadQuery, StatusQuery, fleet_status

COOKIE = "discovery_session"
COOKIE_PATH = "/ui"
SESSION_S = 12 * 3600
MAX_FORM_BYTES = 4096
MAX_FORM_FIELDS = 4
MAX_REVOKED = 10_000  # cookies revoked by a logout and not yet expired, at most
_EXPIRY_DIGITS = 12  # an expiry is a Unix time in seconds: 10 digits until 2286
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHOWN_HEADER = 100  # characters of a refusing header shown back (escaped)
_STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it, browsers send `Origin: null` on the page's own
    # form posts, which cross_site() must then refuse where Sec-Fetch-Site is
    # not sent. No other site is ever sent a referrer either way.
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}

ProxiesFn = Callable[[], Awaitable[list[dict[str, Any]]]]


def _asset(name: str) -> bytes:
    return resources.files("discovery").joinpath("static", name).read_bytes()


@dataclass(frozen=True)
class Verdict:
    """Whether a request may see the page; `retry_after` > 0: its address is
    braked for that many seconds (429)."""

    allowed: bool
    retry_after: int = 0


class Sessions:
    """Checks the token and the session cookies derived from it. `brake` slows
    down wrong bearer tokens (share BearerAuth's: one count per address for
    the API's header wherever it is sent); `login_brake` the login form's,
    apart, so that a page posting wrong logins never slows the API."""

    def __init__(
        self,
        token: str | None,
        clock: Callable[[], float] = time.time,
        brake: Brake | None = None,
        max_revoked: int = MAX_REVOKED,
        login_brake: Brake | None = None,
    ) -> None:
        self.required = bool(token)
        self._digest = token_digest(token) if token else b""
        self._key = hashlib.sha256(b"discovery-ui-session\0" + self._digest).digest()
        self._clock = clock
        self.brake = brake if brake is not None else Brake()
        self.login_brake = login_brake if login_brake is not None else Brake()
        self._max_revoked = max_revoked
        self._revoked: dict[str, int] = {}  # MAC -> expiry
        self._revoked_by_expiry: list[tuple[int, str]] = []  # a heap

    def token_ok(self, given: str) -> bool:
        """The login form's token, compared as the API's bearer token is."""
        return token_matches(given.encode(), self._digest)

    def new_cookie(self) -> str:
        # The nonce tells two sessions of one second apart: a logout ends its own.
        expires = int(self._clock()) + SESSION_S
        nonce = secrets.token_hex(8)
        return f"{expires}.{nonce}.{self._mac(expires, nonce)}"

    def cookie_ok(self, value: str | None) -> bool:
        session = self._session(value)
        return session is not None and session[1] not in self._revoked

    def revoke(self, value: str | None) -> None:
        """Ends the session of `value` (a valid cookie; anything else is ignored):
        its MAC is kept until the cookie's own expiry, MAX_REVOKED at most."""
        session = self._session(value)
        if session is None or session[1] in self._revoked:
            return
        now = self._clock()
        heap = self._revoked_by_expiry
        while heap and (heap[0][0] <= now or len(heap) >= self._max_revoked):
            _, mac = heapq.heappop(heap)  # expired, or the first to expire when full
            del self._revoked[mac]
        self._revoked[session[1]] = session[0]
        heapq.heappush(heap, session)

    def _session(self, value: str | None) -> tuple[int, str] | None:
        """(expiry, MAC) of a cookie this service issued and that has not expired."""
        if not value:
            return None
        expires, _, rest = value.partition(".")
        nonce, _, mac = rest.partition(".")
        # str.isdigit() takes "²" and int() refuses it; a long string is no
        # expiry, and int() of one is slow or refused (4,300 digits).
        if not (expires.isascii() and expires.isdigit() and len(expires) <= _EXPIRY_DIGITS):
            return None
        if int(expires) <= self._clock():
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(int(expires), nonce).encode()):
            return None
        return int(expires), mac

    def _mac(self, expires: int, nonce: str) -> str:
        message = f"{expires}.{nonce}".encode(errors="replace")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def admit(self, request: Request, *, bearer: bool = False) -> Verdict:
        """Whether the request may see the page (`bearer`: or carries the API's
        header, braked like the API's)."""
        if not self.required or self.cookie_ok(request.cookies.get(COOKIE)):
            return Verdict(True)
        header = request.headers.get("authorization") if bearer else None
        if header is None:
            return Verdict(False)
        address = client_address(request)
        wait = self.brake.retry_after(address)
        if wait:
            return Verdict(False, wait)
        if bearer_matches(header.encode("latin-1"), self._digest):
            self.brake.succeeded(address)
            return Verdict(True)
        self.brake.failed(address, "bearer")
        return Verdict(False)

    def allowed(self, request: Request, *, bearer: bool = False) -> bool:
        return self.admit(request, bearer=bearer).allowed


def client_address(request: Request) -> str | None:
    return request.client.host if request.client else None


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port filled in; None if it is none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port out of range or not a number
        return None
    default = _DEFAULT_PORTS.get(parts.scheme.lower())
    if default is None or not parts.hostname:
        return None
    return parts.scheme.lower(), parts.hostname, port or default


def cross_site(request: Request) -> str | None:
    """Which header shows a POST sent by another site's page (None: none does).

    `Sec-Fetch-Site`, set by the browser and beyond a page's reach, decides
    when it is there: `same-origin` or `none` (typed, a bookmark) is the page
    itself. Else `Origin`, sent by browsers with every POST, must be the
    service's own: the scheme and `Host` the request reached it with, so
    behind a reverse proxy that proxy must pass `Host` (and
    `X-Forwarded-Proto` for TLS it terminates). curl and scripts send
    neither and are not refused: they could send anything."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site.lower() in ("same-origin", "none"):
            return None
        return f"Sec-Fetch-Site: {site[:_SHOWN_HEADER]}"
    given = request.headers.get("origin")
    if given is None:
        return None
    own = _origin(f"{request.url.scheme}://{request.url.netloc}")  # netloc: the Host header
    if own is None or _origin(given) != own:
        return f"Origin: {given[:_SHOWN_HEADER]}"
    return None


def ui_routes(
    proxies: ProxiesFn,
    sessions: Sessions,
    *,
    grants_last_minute: Callable[[], int],
    probe_targets: Callable[[], list[tuple[str, bool]]] = list,
    clock: Callable[[], float] = time.time,
) -> list[Route]:
    """The page's routes; `proxies` is the lease book's `proxies_json(detail=True)`."""
    page = _asset("index.html")
    login = _asset("login.html").decode()
    static = {name: _asset(name) for name in _STATIC}

    def html(
        body: bytes | str, status: int = 200, headers: dict[str, str] | None = None
    ) -> Response:
        return Response(body, status, {**_HEADERS, **(headers or {})}, media_type="text/html")

    def login_page(message: str = "", status: int = 401, retry_after: int = 0) -> Response:
        # `message` is one of this module's texts: what a client sent is escaped in it.
        if message:
            message = f'<p class="error" role="alert">{message}</p>'
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        return html(login.replace("<!--message-->", message), status, headers)

    async def root(request: Request) -> Response:
        return RedirectResponse("/ui/", 303)

    async def index(request: Request) -> Response:
        if not sessions.allowed(request):
            return login_page()
        return html(page)

    def refused_cross_site(request: Request) -> Response | None:
        # Before anything is read or counted: another site's post is no guess.
        header = cross_site(request)
        if header is None:
            return None
        message = (
            f"This form was sent from another site ({markup.escape(header)}): "
            "use the form of this page."
        )
        return login_page(message, 403)

    async def do_login(request: Request) -> Response:
        refused = refused_cross_site(request)
        if refused is not None:
            return refused
        if not sessions.required:
            return RedirectResponse("/ui/", 303)
        address = client_address(request)
        wait = sessions.login_brake.retry_after(address)
        if wait:
            source = "this address" if sessions.login_brake.closed(address) else "many addresses"
            message = f"Too many wrong tokens from {source}: try again in {wait} s."
            return login_page(message, 429, retry_after=wait)
        body = await request.body()
        try:
            fields = parse_qs(
                body[:MAX_FORM_BYTES].decode(errors="replace"), max_num_fields=MAX_FORM_FIELDS
            )
        except ValueError:  # more fields than that: no form of this page
            return login_page(f"The form has more than {MAX_FORM_FIELDS} fields.", 400)
        given = (fields.get("token") or [""])[0]
        if not given:
            return login_page("Wrong token.")  # no guess: not counted
        if not sessions.token_ok(given):
            sessions.login_brake.failed(address, "login")
            return login_page("Wrong token.")
        sessions.login_brake.succeeded(address)
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
        refused = refused_cross_site(request)
        if refused is not None:
            return refused
        # Deleting the cookie asks the browser; revoking it makes sure (a copy
        # of the cookie opens nothing either, on this replica).
        sessions.revoke(request.cookies.get(COOKIE))
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
        verdict = sessions.admit(request, bearer=True)
        if verdict.retry_after:
            detail = sessions.brake.refusal_detail(client_address(request), verdict.retry_after)
            headers["Retry-After"] = str(verdict.retry_after)
            return _json({"error": "too_many_requests", "detail": detail}, 429, headers)
        if not verdict.allowed:
            return _json({"error": "unauthorized", "detail": "log in first"}, 401, headers)
        try:
            query = StatusQuery.parse(request.query_params)
        except BadQuery as exc:
            return _json({"error": "bad_request", "detail": str(exc)}, 400, headers)
        answer = fleet_status(
            await proxies(),
            query,
            now=clock(),
            grants_last_minute=grants_last_minute(),
            probe_targets=probe_targets(),
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
