"""The HTTP API for crawlers (docs/discovery.md, "For crawler authors"), on Starlette.

Every error answers `{"error": code, "detail": text}`: 400 bad input (a body
that fails validation included), 401 token, 404 unknown lease or path, 405
method, 409 nothing eligible (with Retry-After), 413 body too large, 429 too many
wrong tokens from one address (with Retry-After), 503
store unavailable.

Starlette rather than FastAPI: on the one core the service is sized for,
FastAPI's per-request machinery cost more than the lease logic and the
durable commit together (see docs/discovery.md, "Performance"). Bodies are
validated by the pydantic models of schemas.py, and the OpenAPI document is
built from those same models (openapi.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic_core import to_json
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from discovery.book.contract import LeaseBook
from discovery.book.errors import StoreUnavailable
from discovery.hotpath import HotPath, host, parse
from discovery.http_errors import HANDLED, error_answer
from discovery.middleware import BearerAuth, BodyLimit, RequestMetrics
from discovery.openapi import openapi_document
from discovery.schemas import GatewayReportRequest
from discovery.service import Service
from discovery.signals import BadSignalsQuery, parse_window, signals_json
from discovery.ui import Sessions, ui_routes

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
}


def json_response(
    content: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(to_json(content), status, headers, media_type="application/json")


def error(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    return json_response({"error": code, "detail": detail}, status, headers)


def create_app(service: Service) -> ASGIApp:
    """The ASGI app: the routes, wrapped in request metrics, bearer auth and a body size limit."""

    def book() -> LeaseBook:  # exists once the lifespan has started the service
        return service.book

    async def proxies(request: Request) -> Response:
        return json_response({"proxies": await book().proxies_json()})

    async def signals(request: Request) -> Response:
        try:
            window = parse_window(
                {key: request.query_params.getlist(key) for key in request.query_params}
            )
        except BadSignalsQuery as exc:
            return error(400, "bad_request", str(exc))
        return json_response(await signals_json(book(), window))

    async def gateway_report(request: Request) -> Response:
        body = parse(await request.body(), GatewayReportRequest)
        gateway = service.gateway
        site = host(body.target)
        if gateway is None or not await gateway.report(
            body.holder, body.session, body.outcome, site
        ):
            detail = "that holder's session holds no lease on this replica"
            if gateway is None:
                detail = "this service runs no gateway (--gateway)"
            return error(404, "session_not_found", detail)
        return Response(status_code=204)

    async def readyz(request: Request) -> Response:
        # 503 while starting or stopping, while the store cannot write, while
        # the fleet source is broken (Service.not_ready); /healthz is liveness only.
        problem = service.not_ready()
        if problem is not None:
            return error(503, *problem)
        return json_response({"status": "ready"})

    async def metrics(request: Request) -> Response:
        # The gauges as of now (PostgreSQL: one query), not as of the last sweep;
        # a store that cannot answer leaves them as they were.
        with contextlib.suppress(StoreUnavailable):
            await book().refresh_snapshot()
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    document = to_json(openapi_document(bearer=bool(service.settings.token)))

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    # -- errors --------------------------------------------------------------------------

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = _STATUS_CODES.get(exc.status_code, "error")
        return error(exc.status_code, code, exc.detail, exc.headers)

    async def book_error(request: Request, exc: Exception) -> Response:
        answer = error_answer(exc)  # the hot path's table too
        return error(answer.status, answer.code, answer.detail, answer.headers)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    async def detailed() -> list[dict[str, Any]]:
        rows = await book().proxies_json(detail=True)
        used = service.gateway.status() if service.gateway is not None else {}
        for row in rows:
            row["gateway"] = used.get(row["name"])
        return rows

    # The status page (ui.py): its own login, a cookie that only it accepts.
    brake = service.brake  # one count of wrong tokens per address: API, status page, gateway
    page = ui_routes(
        detailed,
        Sessions(service.settings.token, brake=brake),
        grants_last_minute=service.metrics.recent_grants.total,
        probe_targets=service.probe_targets,
    )
    app = Starlette(
        routes=[
            Route("/v1/proxies", proxies, methods=["GET"]),
            Route("/v1/signals", signals, methods=["GET"]),
            Route("/v1/gateway/report", gateway_report, methods=["POST"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            *page,
        ],
        exception_handlers={
            HTTPException: http_error,
            **dict.fromkeys(HANDLED, book_error),
            Exception: book_error,
        },
        lifespan=lifespan,
    )
    # The lease routes and /healthz are answered by HotPath (hotpath.py) before Starlette.
    return RequestMetrics(
        BearerAuth(BodyLimit(HotPath(app, book)), service.settings.token, brake=brake),
        service.metrics.request_seconds,
    )
