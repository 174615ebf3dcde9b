"""The autopilot planner's inputs as its unit tests write them: a policy as
the stack config writes it, groups made an hour before NOW, every proxy
healthy unless a test says otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from proxyinfra.autopilot.fleet import FleetGroup, FleetProxy
from proxyinfra.autopilot.policy import AutopilotPolicy
from proxyinfra.autopilot.signals import ProxySignal

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
GIB = 1 << 30


def policy(
    recycle: Mapping[str, Any] | None = None, scale: Mapping[str, Any] | None = None, k: int = 10
) -> AutopilotPolicy:
    """As the stack config writes it (camelCase, durations as text)."""
    block: dict[str, Any] = {"maxChangesPerRound": k}
    if recycle is not None:
        block["recycle"] = {"bannedSites": 3, "window": "10m", "healthyFloor": 0} | dict(recycle)
    if scale is not None:
        block["scale"] = {"groups": {"home": {"min": 2, "max": 4}}} | dict(scale)
    return AutopilotPolicy.model_validate(block)


def group(
    name: str = "home",
    replicas: int = 2,
    *,
    backend: str = "kvm",
    provider: str = "kvm-home",
    made: datetime = NOW - timedelta(hours=1),
    place: str | None = None,
    needs: Mapping[str, int] | None = None,
) -> FleetGroup:
    proxies = tuple(FleetProxy(f"{name}-{i}", made) for i in range(replicas))
    return FleetGroup(name, provider, backend, replicas, proxies, place, needs or {})


def fine(*groups: FleetGroup) -> dict[str, ProxySignal]:
    return {p.name: ProxySignal(True) for g in groups for p in g.proxies}


WINDOW = timedelta(minutes=10)
