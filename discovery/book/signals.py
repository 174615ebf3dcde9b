"""What the autopilot reads of the lease service (`GET /v1/signals`,
discovery/signals.py): how many distinct sites reported each proxy blocked
within a window, and how many grants were refused (409) for each proxy
group. Both are counted by the store from rows it keeps (reports, and
refusals), so every replica of a shared store gives the same answer, and
both stores give the same answer to the same history.

The rules both stores follow are here, once: the window's bounds, how long
and how many refusal rows are kept, and which group a proxy belongs to (the
stack's own naming rule, proxyinfra/generations.py, imported)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The group of a proxy is the stack's rule (a replica `<entry>-<n>`, at a
# generation `-g<N>` from 2 on): the fleet manifest does not name the entry.
from proxyinfra.generations import group_of

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


def groups_of(proxies: Iterable[str]) -> list[str]:
    """The distinct groups of `proxies`, sorted (`home-0` and `home-0-g2` are both `home`)."""
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
