"""The request histogram's labels come from fixed sets (discovery/metrics.py,
discovery/middleware.py; over HTTP on both stores:
tests/integration/test_discovery_metrics_labels.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from discovery.metrics import HTTP_METHODS, OTHER, Metrics, method_label
from discovery.middleware import RequestMetrics


def test_known_methods_are_their_own_label_and_any_other_is_other() -> None:
    for method in HTTP_METHODS:
        assert method_label(method) == method
    for method in ("PROPFIND", "M-SEARCH", "QUERY", "get", "", "GET " * 100):
        assert method_label(method) == OTHER


def test_a_request_is_counted_under_fixed_labels_only() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def run() -> None:
        layer = RequestMetrics(app, metrics.request_seconds)
        for method, path in (("PROPFIND", "/x/1"), ("UNLINK", "/y/2"), ("GET", "/z/3")):
            scope = {"type": "http", "method": method, "path": path, "headers": []}
            await layer(scope, _nothing, _discard)

    asyncio.run(run())
    count = "discovery_request_duration_seconds_count"
    labels = {"route": "unmatched", "status": "404"}
    assert registry.get_sample_value(count, {"method": "other", **labels}) == 2
    assert registry.get_sample_value(count, {"method": "GET", **labels}) == 1
    assert registry.get_sample_value(count, {"method": "PROPFIND", **labels}) is None


async def _nothing() -> dict[str, object]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _discard(message: object) -> None:
    pass
