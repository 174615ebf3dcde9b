"""The fleet status page's data: one answer per refresh, whatever the fleet's size.

`fleet_status` takes the fleet as the lease book shows it (`proxies_json(detail=True)`,
the same on SQLite and PostgreSQL), counts the totals over the whole fleet,
lists what the filters can choose from, and returns one page of the proxies
that match the filters. The page's browser never asks per proxy, and never
receives more than one page of them (docs/architecture.md, decision log).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from discovery.book.views import rfc3339

STATES = ("healthy", "unhealthy", "unknown", "leased", "free", "cooling")
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_OFFSET = 1_000_000_000  # far past any fleet; bounds the digits int() reads
PARAMETERS = ("provider", "zone", "label", "state", "name", "offset", "limit")
MAX_FACET_VALUES = 500  # per filter: a fleet with more distinct labels lists the first ones


class BadQuery(ValueError):
    """A query parameter the status endpoint does not accept."""


@dataclass(frozen=True)
class StatusQuery:
    provider: str | None = None
    zone: str | None = None
    label: tuple[str, str] | None = None  # key, value
    state: str | None = None
    name: str | None = None  # a part of the name
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> StatusQuery:
        """From the query string; a parameter that is there must be valid
        (the page leaves out the filters it does not use)."""
        unknown = sorted(set(params) - set(PARAMETERS))
        if unknown:
            raise BadQuery(f"unknown parameter {unknown[0]!r}")
        label = None
        if "label" in params:
            key, sep, value = params["label"].partition("=")
            if not sep or not key:
                raise BadQuery("label: want key=value")
            label = (key, value)
        state = params.get("state")
        if state is not None and state not in STATES:
            raise BadQuery(f"state: one of {', '.join(STATES)}")
        return cls(
            provider=params.get("provider"),
            zone=params.get("zone"),
            label=label,
            state=state,
            name=params.get("name"),
            offset=_integer(params, "offset", 0, 0, MAX_OFFSET),
            limit=_integer(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        )

    def matches(self, proxy: Mapping[str, Any]) -> bool:
        if self.provider is not None and proxy["provider"] != self.provider:
            return False
        if self.zone is not None and proxy["zone"] != self.zone:
            return False
        if self.label is not None and proxy["labels"].get(self.label[0]) != self.label[1]:
            return False
        if self.name is not None and self.name.lower() not in proxy["name"].lower():
            return False
        return self.state is None or self.state in states_of(proxy)


def _integer(params: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = params.get(key)
    if raw is None:
        return default
    # ASCII digits only (str.isdigit takes "²", which int() refuses), and no
    # more of them than `high` has: int() of a long string is slow, and
    # refused past 4,300 digits.
    if not (raw.isascii() and raw.isdigit()) or len(raw.lstrip("0")) > len(str(high)):
        raise BadQuery(f"{key}: {_shown(raw)} is not a whole number from {low} to {high}")
    value = int(raw)
    if not low <= value <= high:
        raise BadQuery(f"{key}: {value} is not a whole number from {low} to {high}")
    return value


def _shown(raw: str, limit: int = 24) -> str:
    """A client's value in an error: quoted, and cut short."""
    return repr(raw if len(raw) <= limit else raw[:limit] + "...")


def states_of(proxy: Mapping[str, Any]) -> tuple[str, ...]:
    """The states a proxy is in, as the state filter names them."""
    return (
        proxy["health"],
        "leased" if proxy["leased"] else "free",
        *(("cooling",) if proxy["cooldowns"] else ()),
    )


def fleet_status(
    proxies: Sequence[Mapping[str, Any]],
    query: StatusQuery,
    *,
    now: float,
    grants_last_minute: int,
    probe_targets: Sequence[tuple[str, bool]] = (),
) -> dict[str, Any]:
    """The status endpoint's answer (see discovery/openapi.py, FleetStatus)."""
    totals = {"proxies": 0, "healthy": 0, "unhealthy": 0, "unknown": 0, "leased": 0, "cooling": 0}
    providers: set[str] = set()
    zones: set[str] = set()
    labels: set[str] = set()
    matching = []
    for proxy in proxies:
        totals["proxies"] += 1
        totals[proxy["health"]] = totals.get(proxy["health"], 0) + 1
        totals["leased"] += bool(proxy["leased"])
        totals["cooling"] += bool(proxy["cooldowns"])
        providers.add(proxy["provider"])
        if proxy["zone"] is not None:
            zones.add(proxy["zone"])
        if len(labels) < MAX_FACET_VALUES:
            labels.update(f"{k}={v}" for k, v in proxy["labels"].items())
        if query.matches(proxy):
            matching.append(proxy)
    return {
        "now": rfc3339(now),
        "totals": {**totals, "grantsPerMinute": grants_last_minute},
        "filters": {
            "providers": sorted(providers),
            "zones": sorted(zones),
            "labels": sorted(labels)[:MAX_FACET_VALUES],
            "states": list(STATES),
        },
        "matching": len(matching),
        "offset": query.offset,
        "limit": query.limit,
        "proxies": matching[query.offset : query.offset + query.limit],
        "probeTargets": [{"target": target, "down": down} for target, down in probe_targets],
    }
