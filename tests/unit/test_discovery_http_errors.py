"""The answer to an error nobody expected (discovery/http_errors.py): a 500
with the generic text, never the exception's own (it may carry a password
of a proxy URL, a token, a path), on the hot path's routes (hotpath.py) as
on Starlette's (app.py). The real app in this process, its lease book made
to raise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.app import create_app
from discovery.book.contract import LeaseBook
from discovery.service import Service
from tests.support.discovery import FakeHealth, proxy_entry, settings_for, write_fleet
from tests.support.logcapture import every_record

SECRET = "s3cret-proxy-password-4f1d"
GENERIC = {"error": "internal_error", "detail": "internal error; see the service's log"}


class Broken(RuntimeError):
    """What a bug deep in a book could raise: its text carries a secret."""


class Raising:
    """The service's book, except that `broken` operations raise Broken."""

    def __init__(self, book: LeaseBook, broken: set[str]) -> None:
        self._book = book
        self._broken = broken

    def __getattr__(self, name: str) -> Any:
        if name in self._broken:

            async def fail(*args: Any, **kwargs: Any) -> Any:
                raise Broken(f"connection to http://crawler:{SECRET}@10.0.0.9 failed")

            return fail
        return getattr(self._book, name)


@asynccontextmanager
async def served(tmp_path: Path, broken: set[str]) -> AsyncIterator[httpx.AsyncClient]:
    """The real app with its book's `broken` operations raising; exceptions
    Starlette re-raises after answering (for the server's log) stay in it."""
    settings = settings_for(tmp_path)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("p0")])
    service = Service(settings, health_factory=lambda listener, _: FakeHealth(listener))
    service.open()
    app = create_app(service)
    await service.start()
    service._book = Raising(service.book, broken)
    try:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://discovery") as http:
            yield http
    finally:
        await service.stop()
        service.close()


@pytest.mark.parametrize(
    ("operation", "method", "path", "body"),
    [
        ("grant", "POST", "/v1/leases", {"holder": "c"}),
        ("renew", "POST", "/v1/leases/L/renew", {}),
        ("report", "POST", "/v1/leases/L/report", {"outcome": "ok"}),
        ("release", "DELETE", "/v1/leases/L", None),
        ("proxies_json", "GET", "/v1/proxies", None),  # answered by Starlette
    ],
)
def test_an_unexpected_error_is_a_500_without_its_text(
    tmp_path: Path, operation: str, method: str, path: str, body: dict[str, Any] | None
) -> None:
    async def scenario() -> httpx.Response:
        async with served(tmp_path, {operation}) as http:
            return await http.request(method, path, json=body)

    with every_record() as records:
        answer = asyncio.run(scenario())
    assert answer.status_code == 500
    assert answer.json() == GENERIC
    assert SECRET not in answer.text
    assert any("unhandled error" in r for r in records)  # the log is where it goes
