"""Prometheus metrics of the lease service, in the registry it shares with the
health engine (so one `/metrics` answer holds both).

Counters count events as they happen; the gauges (active leases, active
cooldowns, proxies by health) are computed from the live state at scrape
time, so they can never drift from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DENIAL_REASONS = ("no_match", "leased", "cooldown", "unhealthy")
# The methods of RFC 9110 and PATCH: the only values of the request histogram's
# `method` label, any other method (httptools accepts 35, WebDAV's and more) is
# OTHER. Every label value comes from a fixed set, never from a client: one
# series per method a client can send would let anyone grow /metrics.
HTTP_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
)
OTHER = "other"
UNMATCHED = "unmatched"  # the route of a request no route template matched
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class StateSnapshot:
    leases_active: int
    cooldowns_active: int
    proxies_by_health: dict[str, int]


def method_label(method: str) -> str:
    """The request histogram's `method` label: the method if HTTP_METHODS has it, else OTHER."""
    return method if method in HTTP_METHODS else OTHER


class RecentRate:
    """Events in the last `window` seconds, counted in one-second buckets (a
    fixed size whatever the rate): the status page's grants per minute."""

    def __init__(self, window: int = 60, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._counts = [0] * window
        self._seconds = [-window] * window  # which second each bucket counts

    def add(self, n: int = 1) -> None:
        second = int(self._clock())
        i = second % self._window
        if self._seconds[i] != second:
            self._seconds[i], self._counts[i] = second, 0
        self._counts[i] += n

    def total(self) -> int:
        """Events in the window that ends now."""
        now = int(self._clock())
        return sum(
            c for c, s in zip(self._counts, self._seconds, strict=True) if now - s < self._window
        )


class _StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], StateSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily]:
        state = self._snapshot()
        yield GaugeMetricFamily(
            "discovery_leases_active", "Leases held right now", value=state.leases_active
        )
        yield GaugeMetricFamily(
            "discovery_cooldowns_active",
            "Proxy cooldowns (per target, or everywhere) not yet over",
            value=state.cooldowns_active,
        )
        proxies = GaugeMetricFamily(
            "discovery_proxies", "Proxies of the fleet by health state", labels=["health"]
        )
        for health, count in sorted(state.proxies_by_health.items()):
            proxies.add_metric([health], count)
        yield proxies


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.granted = Counter("discovery_leases_granted", "Leases granted", registry=registry)
        self.recent_grants = RecentRate()  # this process's, for the status page
        self.denied = Counter(
            "discovery_lease_denials",
            "Grant requests answered 409, by why nothing was eligible",
            ["reason"],
            registry=registry,
        )
        self.released = Counter("discovery_leases_released", "Leases released", registry=registry)
        self.expired = Counter(
            "discovery_leases_expired", "Leases that reached their expiry", registry=registry
        )
        self.revoked = Counter(
            "discovery_leases_revoked",
            "Leases ended because their proxy left the fleet",
            registry=registry,
        )
        self.reports = Counter(
            "discovery_reports", "Crawler reports, by outcome", ["outcome"], registry=registry
        )
        self.fleet_loads = Counter(
            "discovery_fleet_loads",
            "Fleet reads, by result (changed, unchanged, error)",
            ["result"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "discovery_request_duration_seconds",
            "HTTP request latency, by method (HTTP_METHODS, else other), route template "
            "(else unmatched) and status",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "discovery_store_commit_duration_seconds",
            "Time of one lease-store transaction, fsync included",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.commit_ops = Counter(
            "discovery_store_ops", "Operations written to the lease store", registry=registry
        )
        for reason in DENIAL_REASONS:
            self.denied.labels(reason)  # present at 0 from the start
        for outcome in ("ok", "blocked", "error"):
            self.reports.labels(outcome)

    def grant(self) -> None:
        """One lease granted."""
        self.granted.inc()
        self.recent_grants.add()

    def watch_state(self, snapshot: Callable[[], StateSnapshot]) -> None:
        self.registry.register(_StateCollector(snapshot))

    def on_commit(self, ops: int, seconds: float) -> None:
        # Called from the store's writer thread; prometheus_client is thread-safe.
        self.commit_ops.inc(ops)
        self.commit_seconds.observe(seconds)
