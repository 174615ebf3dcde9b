"""`/metrics` holds as many series whatever clients send (issue 39, finding 9):
the request histogram's labels come from fixed sets, so odd methods and odd
paths add nothing after the first of their kind. Before, 336 requests with 34
methods grew /metrics from 318 to 4,062 series. The real app under uvicorn,
on both stores."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.database import PostgresUrl
from discovery.metrics import HTTP_METHODS
from tests.support.discovery import ServerThread, proxy_entry, settings_for, write_fleet
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

# What httptools (llhttp) parses besides HTTP_METHODS: WebDAV's, UPnP's, and more.
ODD_METHODS = (
    "PROPFIND", "COPY", "LOCK", "MKCOL", "MOVE", "PROPPATCH", "SEARCH", "UNLOCK", "BIND",
    "REBIND", "UNBIND", "ACL", "REPORT", "MKACTIVITY", "CHECKOUT", "MERGE", "M-SEARCH",
    "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PURGE", "MKCALENDAR", "LINK", "UNLINK", "SOURCE",
    "QUERY",
)  # fmt: skip
# Every route of the service (each template once), and paths no route has.
ROUTES = (
    "/", "/ui", "/ui/", "/ui/login", "/ui/logout", "/ui/static/app.js", "/ui/api/status",
    "/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/proxies", "/v1/gateway/report",
    "/v1/leases", "/v1/leases/some-id", "/v1/leases/some-id/renew", "/v1/leases/some-id/report",
)  # fmt: skip
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?) ")


def unknown_paths(count: int) -> list[str]:
    rng = random.Random()
    return [
        f"/{rng.choice(('x', 'v1', 'ui', 'v1/leases/a/b'))}/{rng.getrandbits(64):x}"
        for _ in range(count)
    ]


def series(http: httpx.Client) -> set[str]:
    """Every series of /metrics: name and labels of each sample line."""
    text = http.get("/metrics").text
    return {m.group(1) for line in text.splitlines() if (m := _SAMPLE.match(line))}


def request_labels(names: set[str], label: str) -> set[str]:
    found = set()
    for name in names:
        if name.startswith("discovery_request_duration_seconds_count{"):
            found.add(re.search(label + r'="([^"]*)"', name).group(1))  # type: ignore[union-attr]
    return found


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_odd_methods_and_paths_add_no_series(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    db: Any = tmp_path / "leases.db"
    if store == "postgres":
        server: Any = request.getfixturevalue("postgres")
        db = PostgresUrl(server.fresh_database(f"labels_{random.randrange(1 << 30)}"))
    settings = settings_for(tmp_path, db=db)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("p0")])
    with ServerThread(settings) as running, httpx.Client(base_url=running.url, timeout=10) as http:
        # One odd method on every route and on a path no route has, and GET on
        # unknown paths: the series these make are made once.
        first, *others = ODD_METHODS
        for path in (*ROUTES, *unknown_paths(3)):
            http.request(first, path)
        for path in unknown_paths(3):
            http.get(path)
        http.get("/metrics")  # a scrape is counted once answered: the next one shows it
        before = series(http)
        assert len(before) < 1000, len(before)
        # Every other odd method on every route, and many more unknown paths.
        for method in others:
            for path in (*ROUTES, *unknown_paths(3)):
                http.request(method, path)
        for path in unknown_paths(200):
            http.request(random.choice(ODD_METHODS), path)
            http.get(path)
        after = series(http)
        assert after == before, f"new series: {sorted(after - before)[:20]}"
        methods = request_labels(after, "method")
        assert "other" in methods and methods <= HTTP_METHODS | {"other"}, methods
        routes = request_labels(after, "route")
        assert "unmatched" in routes and all(
            r in (*ROUTES, "unmatched") or "{" in r for r in routes
        )
