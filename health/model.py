"""The health engine's vocabulary, shared with the discovery service.

The engine probes every proxy of the fleet and reports state changes to a
:class:`HealthListener` (the lease store); the discovery service reads
:class:`ProxyHealth` for `GET /v1/proxies` and feeds crawler `error` reports
back with :meth:`HealthEngine.report_error` (see health/engine.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class Health(enum.StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Outcome(enum.StrEnum):
    """How one probe ended."""

    OK = "ok"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    RESET = "reset"
    AUTH_REQUIRED = "auth_required"  # 407
    DENIED = "denied"  # 403
    UPSTREAM = "upstream"  # 502 / 503 / 504
    MALFORMED = "malformed"
    TLS = "tls"  # handshake through the tunnel failed
    ERROR = "error"  # anything else (other status codes, DNS, ...)
    # The prober could not run the probe (no file descriptor: EMFILE, ENFILE, or
    # no socket memory): says nothing about the proxy, so it is not counted.
    LOCAL = "local"


@dataclass(frozen=True)
class ProxyEndpoint:
    """One proxy as the engine sees it (from the fleet manifest)."""

    name: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class ProxyHealth:
    name: str
    health: Health
    latency_ms: float | None  # moving average of successful probes
    last_error: str | None
    changed_at: datetime | None
    # The latest probes' total times, oldest first, at most HISTORY of them;
    # None for a probe that failed (the status page's sparkline).
    recent_ms: tuple[float | None, ...] = ()


# How many recent probes a proxy's history keeps (bounded: 10,000 proxies
# times this many numbers is what the service holds for the status page).
HISTORY = 20


class HealthListener(Protocol):
    def on_health_change(self, name: str, health: Health) -> None: ...
