"""`GET /v1/signals?window=SECONDS`: what the autopilot reads (docs/discovery.md,
"Signals for the autopilot"). Per proxy of the fleet: how many distinct
sites reported it `blocked` within the window; per proxy group (the
`proxies[]` entry a replica belongs to, discovery/book/signals.py): grants
refused within the window for selectors that matched it, with its proxies,
healthy ones and leases now.

The counts are the store's (LeaseBook.signals), the fleet view is
`GET /v1/proxies`'s: every replica of a shared store answers alike. The
answer holds one entry per proxy and per group of this fleet, whatever the
history: never credentials, holders' names or sites' names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from discovery.book.contract import LeaseBook
from discovery.book.signals import (
    DEFAULT_WINDOW_S,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    SignalCounts,
    group_of,
)
from discovery.book.views import rfc3339

PARAMETERS = ("window",)


class BadSignalsQuery(ValueError):
    """A query the signals endpoint does not accept (its text names the parameter)."""


def parse_window(params: Mapping[str, Sequence[str]]) -> float:
    """The window in seconds: `window`, a whole number from MIN_WINDOW_S to
    MAX_WINDOW_S, given at most once; DEFAULT_WINDOW_S without it."""
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise BadSignalsQuery(f"unknown parameter {_shown(unknown[0])}; only window is known")
    given = params.get("window", ())
    if not given:
        return DEFAULT_WINDOW_S
    low, high = int(MIN_WINDOW_S), int(MAX_WINDOW_S)
    want = f"is not a whole number of seconds from {low} to {high}"
    if len(given) > 1:
        raise BadSignalsQuery("window: given more than once")
    raw = given[0]
    # ASCII digits only, and no more of them than the maximum has (int() of a
    # long string is slow).
    if not (raw.isascii() and raw.isdigit()) or len(raw.lstrip("0")) > len(str(high)):
        raise BadSignalsQuery(f"window: {_shown(raw)} {want}")
    value = int(raw)
    if not low <= value <= high:
        raise BadSignalsQuery(f"window: {value} {want}")
    return float(value)


def _shown(raw: str, limit: int = 24) -> str:
    return repr(raw if len(raw) <= limit else raw[:limit] + "...")


async def signals_json(book: LeaseBook, window: float) -> dict[str, Any]:
    """The answer for `window` seconds ending at the store's now."""
    counts = await book.signals(window)
    fleet = await book.proxies_json()
    return build(counts, fleet)


def build(counts: SignalCounts, fleet: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The answer from the store's counts and the fleet as `GET /v1/proxies`
    shows it: proxies in manifest order, groups in order of their first
    proxy; counts of proxies and groups the fleet lacks are left out."""
    bans = {ban.proxy: ban for ban in counts.bans}
    refusals = {r.group: r for r in counts.refusals}
    proxies: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    for row in fleet:
        name, group = row["name"], group_of(row["name"])
        ban = bans.get(name)
        proxies.append(
            {
                "name": name,
                "group": group,
                "health": row["health"],
                "leased": row["leased"],
                "blockedSites": ban.sites if ban else 0,
                "blocks": ban.blocks if ban else 0,
                "lastBlockedAt": rfc3339(ban.last_at) if ban else None,
            }
        )
        entry = groups.get(group)
        if entry is None:
            refused = refusals.get(group)
            entry = groups[group] = {
                "name": group,
                "proxies": 0,
                "healthy": 0,
                "leased": 0,
                "refused": refused.refused if refused else 0,
                "refusedHolders": refused.holders if refused else 0,
                "firstRefusedAt": rfc3339(refused.first_at) if refused else None,
                "lastRefusedAt": rfc3339(refused.last_at) if refused else None,
            }
        entry["proxies"] += 1
        entry["healthy"] += row["health"] == "healthy"
        entry["leased"] += bool(row["leased"])
    return {
        "now": rfc3339(counts.now),
        "windowSeconds": int(counts.window),
        "proxies": proxies,
        "groups": list(groups.values()),
    }


__all__ = ["PARAMETERS", "BadSignalsQuery", "build", "parse_window", "signals_json"]
