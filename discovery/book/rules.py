"""The lease rules both stores apply, each written once: the TTL's bounds,
the cooldown scopes and their cap, the report caps, the lease-id scheme, the
fleet diff and the refusal (409) with its Retry-After."""

from __future__ import annotations

import base64
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from discovery.book.errors import NoProxyAvailable
from discovery.targets import EVERYWHERE

# A proxy cools down for at most this many distinct targets at once; one
# `blocked` more widens its cooldown to every target (merge_cooldown).
MAX_TARGET_COOLDOWNS = 64
# Reports are kept at most this long and at most the newest this many: at
# ~470 reports/s, 7 days alone would be 280 million rows.
REPORT_RETENTION_S = 7 * 24 * 3600.0
REPORTS_KEPT = 1_000_000

# A lease id: 16 random bytes, URL-safe base64 without padding.
LEASE_ID_BYTES = 16
_LEASE_ID = re.compile(r"[A-Za-z0-9_-]{22}")


@dataclass(frozen=True)
class Terms:
    """The service's lease settings, the same for either store."""

    max_ttl: float  # a lease's default and longest lifetime (--max-lease-ttl)
    cooldown: float  # how long a `blocked` report keeps a proxy away (--lease-cooldown)
    probe_interval: float  # the earliest news of an unhealthy proxy (Retry-After)


def cap_ttl(requested: float | None, max_ttl: float) -> float:
    """A lease's lifetime: the maximum when none is asked for, never more."""
    return max_ttl if requested is None else min(requested, max_ttl)


def cooldown_scopes(host: str | None) -> list[str]:
    """The cooldown targets that keep a proxy from `host`."""
    return [EVERYWHERE, host] if host else [EVERYWHERE]


def cooling_until(scopes: Mapping[str, float], host: str | None, now: float) -> float | None:
    """When the cooldown among one proxy's `scopes` (target -> until) that
    keeps it from `host` ends; None when none does."""
    until = max((scopes.get(scope, 0.0) for scope in cooldown_scopes(host)), default=0.0)
    return until if until > now else None


def merge_cooldown(scopes: dict[str, float], target: str, until: float, now: float) -> str:
    """Adds a cooldown to one proxy's (target -> until; never shortened) and
    returns the target it ended up under: EVERYWHERE when the proxy now cools
    down for more than MAX_TARGET_COOLDOWNS distinct targets, which widens it
    to one cooldown for every target, until the latest of them ends.

    Widening rather than dropping a target: a proxy blocked by that many
    sites is burnt for most of them, and every cooldown it had is kept (none
    ends early). Both stores apply it: the SQLite book to its memory (and its
    store the same in SQL), the PostgreSQL store in SQL.
    """
    scopes[target] = max(scopes.get(target, 0.0), until)
    if target == EVERYWHERE:
        return target
    live = sum(1 for t, u in scopes.items() if t != EVERYWHERE and u > now)
    if live <= MAX_TARGET_COOLDOWNS:
        return target
    widest = max(scopes.values())
    scopes.clear()
    scopes[EVERYWHERE] = widest
    return EVERYWHERE


class LeaseIds:
    """Unguessable lease ids (an id is what lets a crawler renew, report and
    release), taken from the OS 4 KiB at a time to save a system call per grant."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        if self._at + LEASE_ID_BYTES > len(self._pool):
            self._pool, self._at = os.urandom(4096), 0
        chunk = self._pool[self._at : self._at + LEASE_ID_BYTES]
        self._at += LEASE_ID_BYTES
        return base64.urlsafe_b64encode(chunk).rstrip(b"=").decode()


def is_lease_id(text: str) -> bool:
    """Whether `text` could be an id LeaseIds made: anything else is no lease,
    answered without asking the store (which may not even store it: NUL)."""
    return _LEASE_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class FleetDiff:
    added: list[str]
    removed: list[str]
    changed: list[str]


V = TypeVar("V")


def fleet_diff(old: Mapping[str, V], new: Mapping[str, V]) -> FleetDiff:
    """Which proxies a new fleet adds, removes, and changes (same name, new entry)."""
    return FleetDiff(
        added=[name for name in new if name not in old],
        removed=[name for name in old if name not in new],
        changed=[name for name in new if name in old and new[name] != old[name]],
    )


def round_latency(ms: float | None) -> float | None:
    """A probe's time as the API shows it (and the shared store keeps it)."""
    return round(ms, 3) if ms is not None else None


@dataclass(frozen=True)
class Candidate:
    """A proxy matching a selector, as a refusal (409) explains itself."""

    name: str
    healthy: bool
    leased_until: float | None
    cooling_until: float | None


def refusal(
    candidates: Sequence[Candidate], host: str | None, now: float, probe_interval: float
) -> NoProxyAvailable:
    """Why no proxy among those matching the selector can be leased now, and
    when the first of them may be (Retry-After)."""
    leased = cooling = unhealthy = free_but_cooling = 0
    soonest = math.inf
    for candidate in candidates:
        free_at = now
        if candidate.leased_until is not None:
            leased += 1
            free_at = max(free_at, candidate.leased_until)
        if candidate.cooling_until is not None:
            cooling += 1
            free_at = max(free_at, candidate.cooling_until)
        if not candidate.healthy:
            unhealthy += 1
            # Unknown until probed again; the next probe is the earliest chance.
            free_at = max(free_at, now + probe_interval)
        elif candidate.leased_until is None:
            free_but_cooling += 1
        soonest = min(soonest, free_at)
    matching = len(candidates)
    if matching == 0:
        return NoProxyAvailable(
            "no_match",
            max(1, math.ceil(probe_interval)),
            "no proxy of the fleet matches the selector",
        )
    if free_but_cooling:
        reason = "cooldown"
    elif unhealthy < matching:
        reason = "leased"
    else:
        reason = "unhealthy"
    scope = f" for {host}" if host else ""
    detail = (
        f"{matching} matching {'proxy' if matching == 1 else 'proxies'}: {leased} leased, "
        f"{cooling} cooling down{scope}, {unhealthy} not healthy"
    )
    return NoProxyAvailable(reason, max(1, math.ceil(soonest - now)), detail)


__all__ = [
    "EVERYWHERE",
    "MAX_TARGET_COOLDOWNS",
    "REPORTS_KEPT",
    "REPORT_RETENTION_S",
    "Candidate",
    "FleetDiff",
    "LeaseIds",
    "Terms",
    "cap_ttl",
    "cooldown_scopes",
    "cooling_until",
    "fleet_diff",
    "is_lease_id",
    "merge_cooldown",
    "refusal",
    "round_latency",
]
