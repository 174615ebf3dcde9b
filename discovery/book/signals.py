"""What the autopilot reads of the lease service (`GET /v1/signals`,
discovery/signals.py): how many distinct sites reported each proxy blocked
within a window, and how many grants were refused (409) for each proxy
group. Both are counted by the store from rows it keeps (reports, and
refusals), so every replica of a shared store gives the same answer, and
both stores give the same answer to the same history.

The rules both stores follow are here, once: the window's bounds, how long
and how many refusal rows are kept, and which group a proxy belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# A window is 1 s to 24 h: longer needs rows kept longer (refusals are kept
# for the longest window and no longer).
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 24 * 3600.0
DEFAULT_WINDOW_S = 600.0
# Refusal rows (one per refused grant and group its selector matched) are
# kept for the longest window, and at most the newest this many: under a
# flood of 409s (thousands a second) the counts of a long window are of the
# newest rows only, which is still "demand unmet".
REFUSAL_RETENTION_S = MAX_WINDOW_S
REFUSALS_KEPT = 1_000_000

# `<entry>-<n>`: a replica of a `proxies[]` entry (proxyinfra/config.py,
# replica_names). The fleet manifest does not name the entry, so this is
# where the group is derived from the name, and only here.
_REPLICA = re.compile(r"(?s)(.+)-[0-9]+")


def group_of(proxy: str) -> str:
    """The `proxies[]` entry a proxy replica belongs to: its name without the
    trailing `-<n>` the stack gives each replica; a name without one (an
    `external` entry's single proxy) is its own group."""
    match = _REPLICA.fullmatch(proxy)
    return match.group(1) if match else proxy


def groups_of(proxies: Iterable[str]) -> list[str]:
    """The distinct groups of `proxies`, sorted."""
    return sorted({group_of(name) for name in proxies})


@dataclass(frozen=True, slots=True)
class BanCount:
    """The `blocked` reports on one proxy within a window."""

    proxy: str
    sites: int  # distinct targets named (a `blocked` without one names no site)
    blocks: int  # every `blocked` report, with a target or without
    last_at: float  # the latest


@dataclass(frozen=True, slots=True)
class RefusalCount:
    """The refused grants (409) within a window whose selector matched a
    proxy of one group."""

    group: str
    refused: int
    holders: int  # distinct holders among them
    first_at: float
    last_at: float


@dataclass(frozen=True)
class SignalCounts:
    """What a store counted for one window ending at `now` (its clock)."""

    now: float
    window: float
    bans: list[BanCount]
    refusals: list[RefusalCount]


__all__ = [
    "DEFAULT_WINDOW_S",
    "MAX_WINDOW_S",
    "MIN_WINDOW_S",
    "REFUSALS_KEPT",
    "REFUSAL_RETENTION_S",
    "BanCount",
    "RefusalCount",
    "SignalCounts",
    "group_of",
    "groups_of",
]
