"""What the discovery service tells the planner, as plain values: the answer
of ``GET /v1/signals?window=SECONDS`` (docs/discovery.md, "Signals for the
autopilot") converted by the autopilot command, so the planner never reads
HTTP, JSON or a clock.

The service counts over one window ending at its own clock (``at``); the
autopilot asks with the policy's ``recycle.window``, and the planner refuses
counts over another window rather than compare them with the wrong
threshold. Times are aware datetimes. ``evidence`` gives what of them a
change answers, for the decision log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from proxyinfra.autopilot.changes import Change, Recycle
from proxyinfra.autopilot.fleet import FleetGroup


@dataclass(frozen=True)
class ProxySignal:
    """One proxy (``proxies[]`` of the answer)."""

    healthy: bool  # `health` is "healthy"
    blocked_sites: int = 0  # distinct sites that reported it blocked within the window
    last_blocked_at: datetime | None = None  # the latest such report
    # `health` is "unhealthy": its probes failed. Not "unknown" (not probed
    # yet, or a share no replica probes), which says nothing of the proxy.
    unhealthy: bool = False


@dataclass(frozen=True)
class GroupSignal:
    """One group, a ``proxies[]`` entry (``groups[]`` of the answer)."""

    refused: int  # grants answered 409 within the window whose selector matched it
    leased: int  # its proxies held by a lease now


@dataclass(frozen=True)
class Signals:
    """A proxy absent here counts as unhealthy and unbanned; a group absent
    here is neither busy nor idle (the planner scales it only into its bounds)."""

    at: datetime  # the service's now: the window's end
    window: timedelta
    proxies: Mapping[str, ProxySignal] = field(default_factory=dict)  # by manifest name
    groups: Mapping[str, GroupSignal] = field(default_factory=dict)  # by proxies[] name

    @property
    def start(self) -> datetime:
        return self.at - self.window

    def unmet_per_minute(self, group: GroupSignal) -> float:
        return group.refused / (self.window.total_seconds() / 60)


def evidence(change: Change, signals: Signals, groups: Sequence[FleetGroup]) -> dict[str, Any]:
    """What the service said that the change answers (for the decision log)."""
    if isinstance(change, Recycle):
        proxy = signals.proxies.get(change.proxy)
        made = next(
            (p.created_at for g in groups for p in g.proxies if p.name == change.proxy), None
        )
        out: dict[str, Any] = {"healthy": proxy.healthy if proxy else None}
        if change.rule == "unhealthyFor":
            out["unhealthy"] = proxy.unhealthy if proxy else None
        if change.rule == "bannedSites" and proxy is not None:
            out |= {
                "blockedSites": proxy.blocked_sites,
                "lastBlockedAt": _iso(proxy.last_blocked_at),
            }
        out["createdAt"] = _iso(made)
        out["window"] = int(signals.window.total_seconds())
        return out
    group = signals.groups.get(change.group)
    out = {"replicas": change.before, "window": int(signals.window.total_seconds())}
    if group is not None:
        out |= {
            "refused": group.refused,
            "perMinute": round(signals.unmet_per_minute(group), 3),
            "leased": group.leased,
        }
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
