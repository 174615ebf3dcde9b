"""What the lease service needs from the health engine (health/engine.py
satisfies it structurally; tests pass small fakes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry

from health.model import Health, HealthListener, ProxyEndpoint, ProxyHealth


class HealthSource(Protocol):
    def set_fleet(self, endpoints: Iterable[ProxyEndpoint]) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def health(self, name: str) -> ProxyHealth | None: ...

    # health(name).health without the snapshot: grants and the metrics ask
    # it of many proxies at a time.
    def verdict(self, name: str) -> Health | None: ...

    def all(self) -> list[ProxyHealth]: ...

    def report_error(self, name: str, error: str) -> None: ...

    # The proxies probed or reported since the last call: a PostgreSQL
    # replica writes only those each second, not its whole share.
    def take_changed(self) -> list[ProxyHealth]: ...

    async def probe_now(self, name: str) -> ProxyHealth: ...

    # Each probe target and whether it looks down (health/targets.py), for
    # the status page.
    def probe_targets(self) -> list[tuple[str, bool]]: ...


# Builds the engine once the service knows its listener and metrics registry.
HealthFactory = Callable[[HealthListener, CollectorRegistry], HealthSource]
