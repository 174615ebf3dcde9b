"""The gateway's Prometheus metrics, in the service's registry (one /metrics).

Holder names are what clients call themselves: bytes per holder are kept for
the first MAX_HOLDER_SERIES holders seen, the rest under `other`, so a client
naming itself anew per request cannot grow the scrape without bound.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_HOLDER_SERIES = 1000
OTHER = "other"
_FIRST_BYTE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, open_tunnels: Callable[[], int]) -> None:
        Gauge(
            "discovery_gateway_tunnels_open", "CONNECT tunnels open now", registry=registry
        ).set_function(open_tunnels)
        self.tunnels = Counter(
            "discovery_gateway_tunnels",
            "CONNECT requests by outcome: ok, refused (credentials), no_proxy, limit, "
            "upstream_error, denied (the squid refused the destination), bad_request",
            ["outcome"],
            registry=registry,
        )
        self.requests = Counter(
            "discovery_gateway_requests",
            "Plain HTTP requests by outcome: ok, banned (the site refused the proxy), refused, "
            "no_proxy, limit, upstream_error, bad_request",
            ["outcome"],
            registry=registry,
        )
        self._bytes_proxy = Counter(
            "discovery_gateway_proxy_bytes",
            "Bytes through the gateway per proxy: up (client to site) and down",
            ["proxy", "direction"],
            registry=registry,
        )
        self._bytes_holder = Counter(
            "discovery_gateway_holder_bytes",
            f"Bytes through the gateway per holder (the first {MAX_HOLDER_SERIES}; then `other`)",
            ["holder", "direction"],
            registry=registry,
        )
        self.first_byte = Histogram(
            "discovery_gateway_first_byte_seconds",
            "From a client's request to the first byte of the squid's answer",
            buckets=_FIRST_BYTE_BUCKETS,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "discovery_gateway_upstream_errors",
            "Failures of leased squids: refused, reset, closed, timeout, unreachable, protocol, auth",
            ["kind"],
            registry=registry,
        )
        self._holders: set[str] = set()
        self._outcomes: dict[tuple[bool, str], Any] = {}  # label children, resolved once
        self._children: dict[tuple[int, str, str], Any] = {}
        # Per proxy, since start: what the status page shows.
        self.proxy_up: Tally[str] = Tally()
        self.proxy_down: Tally[str] = Tally()

    def count(self, tunnel: bool, outcome: str) -> None:
        child = self._outcomes.get((tunnel, outcome))
        if child is None:
            child = (self.tunnels if tunnel else self.requests).labels(outcome)
            self._outcomes[(tunnel, outcome)] = child
        child.inc()

    def moved(self, proxy: str, holder: str, up: int, down: int) -> None:
        if holder not in self._holders:
            if len(self._holders) < MAX_HOLDER_SERIES:
                self._holders.add(holder)
            else:
                holder = OTHER
        for direction, size, tally in (("up", up, self.proxy_up), ("down", down, self.proxy_down)):
            if size:
                self._child(self._bytes_proxy, proxy, direction).inc(size)
                self._child(self._bytes_holder, holder, direction).inc(size)
                tally[proxy] += size

    def _child(self, counter: Counter, name: str, direction: str) -> Any:
        key = (id(counter), name, direction)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(name, direction)
        return child


__all__ = ["MAX_HOLDER_SERIES", "GatewayMetrics"]
