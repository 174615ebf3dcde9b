"""The lease rules both stores apply, each written once as a pure function
or value: the TTL's bounds (a grant's and a renewal's), what a report does,
the cooldown scopes and their cap, which proxies a grant may take
(eligibility), the report caps, the lease-id scheme, the fleet diff and the
refusal (409) with its Retry-After.

The books (discovery/sqlite/book.py, discovery/postgres/book.py) call these
and hand their results to their stores as plain values: no store computes a
rule of its own. The one exception is where the database must filter (a
grant's pick among thousands of rows): there the PostgreSQL store's SQL
applies `Eligibility`, whose fields it receives as parameters."""

from __future__ import annotations

import base64
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from discovery.book.errors import NoProxyAvailable
from discovery.fleet import FleetProxy
from discovery.selection import Selector
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


# -- lifetimes -----------------------------------------------------------------------------


def cap_ttl(requested: float | None, max_ttl: float) -> float:
    """A granted lease's lifetime: the maximum when none is asked for, never more."""
    return max_ttl if requested is None else min(requested, max_ttl)


def renewal_ttl(requested: float | None, own: float, max_ttl: float) -> float:
    """A renewed lease's lifetime: the one asked for, else the lease's own,
    never more than the maximum (which may have been lowered since the grant:
    a restart with a smaller --max-lease-ttl, or another replica's)."""
    return min(own if requested is None else requested, max_ttl)


# -- cooldowns and reports -----------------------------------------------------------------


def cooldown_scopes(host: str | None) -> tuple[str, ...]:
    """The cooldown targets that keep a proxy from `host`: every target's,
    and the host's own when there is one."""
    return (EVERYWHERE, host) if host else (EVERYWHERE,)


def cooling_until(
    cooldowns: Mapping[str, float], scopes: Sequence[str], now: float
) -> float | None:
    """When the latest of one proxy's `cooldowns` (target -> until) under
    `scopes` ends, if it has not by `now`; None when none keeps it away."""
    until = max((cooldowns.get(scope, 0.0) for scope in scopes), default=0.0)
    return until if until > now else None


@dataclass(frozen=True, slots=True)
class Cooldown:
    target: str  # a host name, or EVERYWHERE
    until: float


@dataclass(frozen=True, slots=True)
class ReportEffect:
    """What one report does beyond being recorded."""

    cooldown: Cooldown | None  # to be merged into the proxy's (merge_cooldown)
    error: str | None  # a failed probe to count against the proxy's health


def report_effect(outcome: str, host: str | None, cooldown: float, now: float) -> ReportEffect:
    """`blocked` keeps the proxy away from `host` (from every target when it
    names none) for `cooldown` seconds from `now` (no cooldown when that is 0);
    `error` counts as one failed probe, saying where; `ok` does nothing more."""
    if outcome == "blocked" and cooldown > 0:
        return ReportEffect(Cooldown(host or EVERYWHERE, now + cooldown), None)
    if outcome == "error":
        where = f" for {host}" if host else ""
        return ReportEffect(None, f"a crawler reported an error{where}")
    return ReportEffect(None, None)


def merge_cooldown(scopes: dict[str, float], target: str, until: float, now: float) -> str:
    """Adds a cooldown to one proxy's (target -> until; never shortened) and
    returns the target it ended up under: EVERYWHERE when the proxy now cools
    down for more than MAX_TARGET_COOLDOWNS distinct targets, which widens it
    to one cooldown for every target, until the latest of them ends.

    Widening rather than dropping a target: a proxy blocked by that many
    sites is burnt for most of them, and every cooldown it had is kept (none
    ends early). Both stores apply it in Python to the cooldowns they hold:
    the SQLite book to its memory once a report is committed and the SQLite
    store to its table as it commits (the same order, so the same result);
    the PostgreSQL book to the rows it read in the report's transaction,
    writing back the one cooldown that results.
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


# -- eligibility ---------------------------------------------------------------------------


# Not frozen: made on every grant and release, and a frozen dataclass takes
# three times as long to make (1 µs); a value all the same, never changed.
@dataclass(slots=True)
class Candidate:
    """Where one proxy of the fleet stands for a grant: what eligibility and a
    refusal (409) are judged on."""

    name: str
    healthy: bool  # the health engine's verdict is `healthy`
    leased_until: float | None  # the end of the lease it is held by, if any
    cooling_until: float | None  # the end of its cooldown under the grant's scopes, if live


@dataclass(slots=True)  # not frozen, as Candidate: one per grant
class Eligibility:
    """What one grant asks of a proxy: that `selector` matches it and that no
    cooldown under `scopes` keeps it away (besides being healthy and free).
    A value, never changed."""

    selector: Selector
    scopes: tuple[str, ...]  # cooldown_scopes(the grant's host)


def eligibility(selector: Selector, host: str | None) -> Eligibility:
    return Eligibility(selector, cooldown_scopes(host))


def available(candidate: Candidate) -> bool:
    """Healthy and held by no lease: the half of eligibility no grant changes
    (what the SQLite book's free pool holds)."""
    return candidate.healthy and candidate.leased_until is None


def eligible(wanted: Eligibility, proxy: FleetProxy, candidate: Candidate) -> bool:
    """Whether a grant asking `wanted` may take `proxy`: available, matched
    by the selector, cooling down for none of the scopes. The SQLite book asks
    it of each proxy of its free pool in order; the PostgreSQL store's GRANT
    statement says the same in SQL, over `wanted`'s fields."""
    return (
        available(candidate)
        and candidate.cooling_until is None
        and (wanted.selector.empty or wanted.selector.matches(proxy))
    )


# -- ids and fleets ------------------------------------------------------------------------


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


# -- refusals ------------------------------------------------------------------------------


def refusal(
    candidates: Sequence[Candidate], host: str | None, now: float, probe_interval: float
) -> NoProxyAvailable:
    """Why none of `candidates` (the proxies the selector matches, none of them
    eligible) can be leased now, and when the first of them may be
    (Retry-After): a proxy available but cooling down says `cooldown`."""
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
        if available(candidate):
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
    "Cooldown",
    "Eligibility",
    "FleetDiff",
    "LeaseIds",
    "ReportEffect",
    "Terms",
    "available",
    "cap_ttl",
    "cooldown_scopes",
    "cooling_until",
    "eligibility",
    "eligible",
    "fleet_diff",
    "is_lease_id",
    "merge_cooldown",
    "refusal",
    "renewal_ttl",
    "report_effect",
    "round_latency",
]
