"""The shared store's rows, as psycopg builds them by column name (class_row)."""

from __future__ import annotations

from dataclasses import dataclass, field

from discovery.book.contract import LeaseRecord


@dataclass(frozen=True)
class GrantRow(LeaseRecord):
    replaced: bool  # it replaced an expired lease of the proxy (counted as expired)


@dataclass(frozen=True)
class LiveLease(LeaseRecord):
    now: float  # the store's time, for the book's decision on it


@dataclass(frozen=True)
class ProxyRow:
    name: str
    health: str
    latency_ms: float | None
    last_error: str | None
    holder: str | None  # of the live lease, if any
    expires_at: float | None
    recent_ms: list[float | None]


@dataclass(frozen=True)
class CooldownRow:
    proxy: str
    target: str
    until: float


@dataclass(frozen=True)
class CandidateRow:
    name: str
    health: str
    leased_until: float | None  # the live lease's end
    cooldowns: dict[str, float]  # target -> until, under the grant's scopes
    now: float  # the store's time


@dataclass(frozen=True)
class HealthCount:
    """The gauges' figures for the proxies of one health."""

    health: str
    proxies: int
    leased: int
    cooling: int


@dataclass(frozen=True)
class ErrorRow:
    proxy: str
    count: int
    error: str


@dataclass(frozen=True)
class HealthView:
    """What the prober writes of one proxy."""

    health: str
    latency_ms: float | None
    last_error: str | None
    recent_ms: tuple[float | None, ...]


@dataclass(frozen=True)
class ProbeRow:
    """A proxy another replica's fleet holds, as its manifest gives it."""

    name: str
    host: str
    port: int
    username: str | None
    password: str | None = field(repr=False)  # never in a log line


@dataclass(frozen=True)
class Scopes:
    now: float
    scopes: dict[str, float]  # target -> until


@dataclass(frozen=True)
class Now:
    now: float


__all__ = [
    "CandidateRow",
    "CooldownRow",
    "ErrorRow",
    "GrantRow",
    "HealthCount",
    "HealthView",
    "LiveLease",
    "Now",
    "ProbeRow",
    "ProxyRow",
    "Scopes",
]
