"""The autopilot's policy: the ``egress-proxies:autopilot`` block of the stack
config, parsed and bounded here, checked against ``proxies`` and
``providers`` in :mod:`proxyinfra.validation`.

Every bound a value needs is in its model, so that a policy the planner
receives is one it can apply without checking again (durations are positive,
``min`` at least 1, thresholds at least 1); the rules that span blocks
(``min`` <= ``max``, group and provider names) are validation's, with the
path of the key they refuse.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from proxyinfra.config import Model, Name

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:\d{1,6}[dhms])+")
_PART = re.compile(r"(\d+)([dhms])")
DURATION_WORDS = "a duration such as 30s, 10m, 1h30m or 2d (units d, h, m, s)"


def parse_duration(value: Any) -> timedelta:
    """A positive duration written as Go and Pulumi write them (``10m``,
    ``1h30m``), days allowed; a bare number is refused, since seconds or
    minutes would be a guess."""
    if not isinstance(value, str) or not _DURATION.fullmatch(value):
        raise ValueError(f"not {DURATION_WORDS}")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(value))
    if seconds == 0:
        raise ValueError("must be longer than 0s")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The shortest form ``parse_duration`` reads back to VALUE (whole seconds)."""
    left = int(value.total_seconds())
    parts = []
    for unit, size in _UNITS.items():
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def _within_a_day(value: timedelta) -> timedelta:
    # The discovery service counts signals over 1 s to 24 h (discovery/book/signals.py).
    if value > timedelta(days=1):
        raise ValueError("at most 1d: the discovery service counts signals over 24h at most")
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
Window = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_within_a_day)]
Count = Annotated[int, Field(ge=1, le=1000)]


class RecyclePolicy(Model):
    """When a proxy is replaced by a new one (a new egress address)."""

    # The contract's two keys: blocked by this many distinct sites within the window.
    banned_sites: Count | None = None
    # Also the window of the refused grants the scale rules read (one request).
    window: Window = timedelta(minutes=10)
    max_age: Duration | None = None
    # Judged unhealthy by the service at every round for this long: replaced
    # (a VM that died, a Spot VM preempted and deleted).
    unhealthy_for: Duration | None = None
    # Never fewer healthy proxies in a group than this while recycling (rolling).
    healthy_floor: Annotated[int, Field(ge=0, le=1000)] = 1
    # Kubernetes providers whose cluster gives each pod its own egress address.
    egress_per_pod: list[Name] = Field(default_factory=list)


class GroupBounds(Model):
    """The replicas a ``proxies[]`` entry may have."""

    min: Count
    max: Count


class ScalePolicy(Model):
    """When a group's replicas change with demand."""

    groups: dict[Name, GroupBounds]
    # Up when grants go unmet (409/503) at least this often per minute.
    unmet_per_minute: Annotated[float, Field(gt=0, le=1_000_000)] = 1.0
    step: Count = 1
    # Down only after no unmet grant and a free proxy for this long.
    idle_after: Duration = timedelta(minutes=15)
    # No change of a group for this long after its last one (hysteresis).
    settle: Duration = timedelta(minutes=15)


class AutopilotPolicy(Model):
    recycle: RecyclePolicy | None = None
    scale: ScalePolicy | None = None
    max_changes_per_round: Count = 2
