"""The API's OpenAPI 3.1 document, built from the same pydantic models that
validate requests (discovery/schemas.py), so the document cannot drift from
what the service accepts and answers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from discovery.book.signals import MAX_WINDOW_S, MIN_WINDOW_S
from discovery.schemas import (
    ErrorAnswer,
    FleetStatus,
    GatewayReportRequest,
    LeaseAnswer,
    LeaseRequest,
    ProxiesAnswer,
    RenewRequest,
    ReportRequest,
    SignalsAnswer,
    StatusAnswer,
)
from discovery.status import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET, STATES

_REF = "#/components/schemas/{model}"
JSON = "application/json"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str, **extra: Any) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref(model)}}, **extra}


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return _json(ErrorAnswer, description, **extra)


_LEASE_ID = {
    "name": "lease_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the `id` of a lease answer",
}
_BRAKED = _error(
    "too many wrong tokens from this client's address: no token from it is checked "
    "until Retry-After has passed",
    headers={
        "Retry-After": {
            "description": "seconds until a token from this address is checked again",
            "required": True,
            "schema": {"type": "integer", "minimum": 1},
        }
    },
)
_COMMON_ERRORS = {
    "400": _error("bad input: the body fails validation (wrong types, unknown fields, ...)"),
    "401": _error("missing or wrong bearer token (only when the service has one)"),
    "413": _error("request body larger than 64 KiB"),
    "429": _BRAKED,
    "503": _error("the lease store could not record the change; nothing was changed"),
}
_NOT_FOUND = {"404": _error("no such lease, or it has ended (released, expired, revoked)")}
_NO_CONTENT = {"204": {"description": "done"}}


def _body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {JSON: {"schema": _ref(model)}}}


def _operations() -> dict[str, dict[str, Any]]:
    return {
        "/v1/leases": {
            "post": {
                "operationId": "grant",
                "tags": ["leases"],
                "summary": "Grant an exclusive lease on a healthy proxy",
                "description": "TTL defaults to, and is capped by, the service's max lease TTL. "
                "Without `target`, only proxies cooling down everywhere are skipped.",
                "requestBody": _body(LeaseRequest),
                "responses": {
                    "201": _json(LeaseAnswer, "the lease; its proxy URL carries the credentials"),
                    "409": _error(
                        "every matching proxy is leased, unhealthy or cooling down",
                        headers={
                            "Retry-After": {
                                "description": "seconds until the first matching proxy is free",
                                "required": True,
                                "schema": {"type": "integer", "minimum": 1},
                            }
                        },
                    ),
                    **_COMMON_ERRORS,
                },
            }
        },
        "/v1/leases/{lease_id}/renew": {
            "post": {
                "operationId": "renew",
                "tags": ["leases"],
                "summary": "Extend a lease to now + TTL, never past the max lease TTL",
                "parameters": [_LEASE_ID],
                "requestBody": _body(RenewRequest, required=False),
                "responses": {
                    "200": _json(LeaseAnswer, "the lease with its new expiry"),
                    **_NOT_FOUND,
                    **_COMMON_ERRORS,
                },
            }
        },
        "/v1/leases/{lease_id}/report": {
            "post": {
                "operationId": "report",
                "tags": ["leases"],
                "summary": "Say how the proxy did",
                "description": "`blocked` puts the proxy into cooldown for the target's host "
                "name (every target without one); `error` counts against its health.",
                "parameters": [_LEASE_ID],
                "requestBody": _body(ReportRequest),
                "responses": {**_NO_CONTENT, **_NOT_FOUND, **_COMMON_ERRORS},
            }
        },
        "/v1/leases/{lease_id}": {
            "delete": {
                "operationId": "release",
                "tags": ["leases"],
                "summary": "Release a lease",
                "parameters": [_LEASE_ID],
                "responses": {**_NO_CONTENT, **_NOT_FOUND, **_COMMON_ERRORS},
            }
        },
        "/v1/gateway/report": {
            "post": {
                "operationId": "reportGatewaySession",
                "tags": ["gateway"],
                "summary": "Say how a gateway session's proxy did (for tunnels)",
                "description": "The same outcomes as a lease report, on the lease the gateway "
                "holds for `holder`'s `session` on this replica; `blocked` and `error` also move "
                "the session to another proxy.",
                "requestBody": _body(GatewayReportRequest),
                "responses": {
                    **_NO_CONTENT,
                    "404": _error("no gateway here, or the session holds no lease on this replica"),
                    **_COMMON_ERRORS,
                },
            }
        },
        "/v1/proxies": {
            "get": {
                "operationId": "proxies",
                "tags": ["fleet"],
                "summary": "The fleet with health, latency, lease and cooldown state",
                "description": "Never shows credentials.",
                "responses": {
                    "200": _json(ProxiesAnswer, "every proxy of the fleet, in manifest order"),
                    "401": _COMMON_ERRORS["401"],
                    "429": _BRAKED,
                },
            }
        },
        "/v1/signals": {
            "get": {
                "operationId": "signals",
                "tags": ["fleet"],
                "summary": "What the autopilot reads: bans per proxy, unmet grants per group",
                "description": "Counted by the store over the window ending at its clock: every "
                "replica of a shared store answers alike. Never shows credentials.",
                "parameters": [
                    _query(
                        "window",
                        {
                            "type": "integer",
                            "minimum": int(MIN_WINDOW_S),
                            "maximum": int(MAX_WINDOW_S),
                        },
                        "seconds; default 600",
                    )
                ],
                "responses": {
                    "200": _json(SignalsAnswer, "every proxy and every group of the fleet"),
                    "400": _error("window is no whole number of seconds from 1 to 86400"),
                    "401": _COMMON_ERRORS["401"],
                    "429": _BRAKED,
                    "503": _error(
                        "the lease store cannot be read now (store_unavailable, overloaded)"
                    ),
                },
            }
        },
        "/ui/api/status": {
            "get": {
                "operationId": "fleetStatus",
                "tags": ["fleet"],
                "summary": "The status page's data: fleet totals and one page of proxies",
                "description": "Takes the bearer token or the status page's session cookie "
                "(set by POST /ui/login). Never shows credentials.",
                "parameters": [
                    _query("provider", {"type": "string"}, "only this provider's proxies"),
                    _query("zone", {"type": "string"}, "only this zone's"),
                    _query(
                        "label",
                        {"type": "string", "pattern": "^[^=]+="},
                        "only those with this label (key=value)",
                    ),
                    _query("state", {"enum": list(STATES)}, "only those in this state"),
                    _query("name", {"type": "string"}, "only those whose name contains this"),
                    _query(
                        "offset",
                        {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
                        "default 0",
                    ),
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                        f"default {DEFAULT_LIMIT}",
                    ),
                ],
                "responses": {
                    "200": _json(FleetStatus, "totals, filter values and the page of proxies"),
                    "400": _error("a query parameter out of range"),
                    "401": _error("no session cookie and no bearer token (when one is set)"),
                    "429": _BRAKED,
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "tags": ["service"],
                "summary": "Liveness",
                "security": [],
                "responses": {"200": _json(StatusAnswer, "the process answers")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "tags": ["service"],
                "summary": "Readiness: store writable, fleet readable, health engine running",
                "security": [],
                "responses": {
                    "200": _json(StatusAnswer, "ready"),
                    "503": _error(
                        "not ready: `not_ready` (starting or stopping), `store_unavailable` "
                        "(the lease store cannot write), `fleet_unreadable` (the fleet source "
                        "is broken; the last good fleet is served)"
                    ),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "tags": ["service"],
                "summary": "Prometheus metrics of the service and of its health engine",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def openapi_document(*, bearer: bool) -> dict[str, Any]:
    """The document; `bearer`: /v1/* operations require the token."""
    models: list[type[BaseModel]] = [
        LeaseRequest,
        RenewRequest,
        ReportRequest,
        GatewayReportRequest,
        LeaseAnswer,
        ProxiesAnswer,
        SignalsAnswer,
        FleetStatus,
        ErrorAnswer,
        StatusAnswer,
    ]
    _, schemas = models_json_schema(
        [(m, "validation" if m.__name__.endswith("Request") else "serialization") for m in models],
        ref_template=_REF,
    )
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "egress-proxies discovery",
            "version": "1",
            "summary": "Exclusive leases on the fleet's egress proxies, for crawlers",
        },
        "paths": _operations(),
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    if bearer:
        document["security"] = [{"bearer": []}]
    return document
