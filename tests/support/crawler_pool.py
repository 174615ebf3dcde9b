"""The crawler client in process against the real discovery app (every layer
of it, through httpx.ASGITransport, health verdicts from a fake): a service
with a small fleet, a pool on it, proxies answered by httpx.MockTransport,
and what the service then lists; a proxy on a socket that refuses every
CONNECT. Shared by test_crawler_pool.py, test_client_shared_rules.py and
test_client_renewals.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from discovery.service import Service
from egress_proxies_client import LeasePool
from tests.support.discovery import FakeHealth, app_client, proxy_entry, settings_for, write_fleet
from tests.support.http import LoopbackServer, QuietHandler

PASSWORD = "pw-of-the-pool"
URL = "http://discovery"  # the app_client's base URL


def fleet_settings(tmp_path: Path, ports: list[int], **options: Any) -> Any:
    values: dict[str, Any] = {"max_lease_ttl": 60, "lease_cooldown": 30}
    values.update(options)
    settings = settings_for(tmp_path, **values)
    assert settings.fleet_file is not None
    write_fleet(
        settings.fleet_file,
        [
            proxy_entry(f"p{i}", port=port, username="crawler", password=PASSWORD)
            for i, port in enumerate(ports)
        ],
    )
    return settings


@asynccontextmanager
async def service(
    tmp_path: Path, ports: list[int] | None = None, **options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    settings = fleet_settings(tmp_path, ports or [4100, 4101, 4102], **options)
    async with app_client(settings) as running:
        yield running


def pool(http: httpx.AsyncClient, counts: Any = None, **options: Any) -> LeasePool:
    def count(key: str, n: int) -> None:
        if counts is not None:
            counts[key] += n

    return LeasePool(URL, holder="pool-test", token="", count=count, http=http, **options)


class Sleeps:
    """The pool's sleep: sleeps, and records what the pool asked for."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await asyncio.sleep(seconds)


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def listed(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in (await http.get("/v1/proxies")).json()["proxies"]}


async def leased(http: httpx.AsyncClient) -> set[str]:
    return {name for name, p in (await listed(http)).items() if p["leased"]}


async def cooling(http: httpx.AsyncClient) -> dict[str, list[str]]:
    """Each proxy's cooldown targets."""
    return {n: [c["target"] for c in p["cooldowns"]] for n, p in (await listed(http)).items()}


def fake_health(running: Service) -> FakeHealth:
    health = running._health
    assert isinstance(health, FakeHealth)
    return health


def proxies_answering(by_port: dict[int, Callable[[httpx.Request], httpx.Response]]) -> Any:
    """proxy_transport for the transports: each proxy (by its port) answers
    through httpx.MockTransport; what each saw is kept."""
    seen: dict[int, list[str]] = {port: [] for port in by_port}

    def make(url: str) -> httpx.AsyncBaseTransport:
        port = httpx.URL(url).port
        assert port is not None

        def handle(request: httpx.Request) -> httpx.Response:
            seen[port].append(request.url.path)
            return by_port[port](request)

        return httpx.MockTransport(handle)

    make.seen = seen  # type: ignore[attr-defined]
    return make


class RefusingProxy(LoopbackServer):
    """A proxy on a socket that refuses every CONNECT with 407, as squid does
    when the credentials are wrong: what a crawler of https sites meets."""

    def __init__(self) -> None:
        self.connects: list[str] = []
        refusing = self

        class Handler(QuietHandler):
            def do_CONNECT(self) -> None:
                refusing.connects.append(self.path)
                self.send_response(407)
                self.send_header("Proxy-Authenticate", 'Basic realm="proxy"')
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler)
