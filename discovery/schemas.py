"""The JSON bodies of the HTTP API (docs/discovery.md, "For crawler authors"), as pydantic
models: they validate requests and describe answers in the OpenAPI document.

Requests are strict: a wrong type is an error rather than coerced ("5" is no
number of seconds), and unknown fields are errors, so a misspelled
`ttlSecond` is reported instead of silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from discovery.targets import TARGET_PATTERN
from discovery.targets import problem as target_problem
from proxyinfra import printable

_STRICT = ConfigDict(extra="forbid", strict=True, populate_by_name=False)

MIN_TTL_S = 1.0
# A lease of less than a second is over before its answer arrives (1e-9 on a
# grant, 1e-300 on a renew): refused, not granted already expired.
TtlSeconds = Annotated[
    float,
    Field(ge=MIN_TTL_S, allow_inf_nan=False, description=f"seconds, at least {MIN_TTL_S:g}"),
]


def _target(value: str) -> str:
    # Checked here rather than with `pattern=`: pydantic's message for a failed
    # pattern quotes the whole expression; this one names the problem.
    reason = target_problem(value)
    if reason is not None:
        raise PydanticCustomError("target", "{reason}", {"reason": reason})
    return value


Target = Annotated[
    str,
    Field(
        min_length=1,
        max_length=2048,
        description="a URL or a host name (ASCII; IDN in xn-- form; a host name of at most "
        "253 characters); cooldowns are kept per host name",
        examples=["https://example.com/page", "example.com"],
        json_schema_extra={"pattern": TARGET_PATTERN},
    ),
    AfterValidator(_target),
]
# Holders and a selector's fields follow the rule of every name that reaches
# a log or a page (proxyinfra/printable.py), the manifest's names among them:
# no control, format or line-separator characters, at most 256 characters.
Name = printable.Name
LabelValue = printable.Value
LabelKey = printable.Key
# The gateway's username parts (discovery/gateway/identity.py, MAX_NAME).
MAX_GATEWAY_NAME = 128


class Selector(BaseModel):
    model_config = _STRICT
    provider: Name | None = None
    zone: Name | None = None
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, json_schema_extra=printable.KEYS
    )


class LeaseRequest(BaseModel):
    model_config = _STRICT
    holder: Annotated[
        str,
        printable.text_field(description="who holds the lease (a crawler id)"),
        AfterValidator(printable.check_printable),
    ]
    ttl_seconds: Annotated[
        TtlSeconds | None,
        Field(
            alias="ttlSeconds",
            description="at least 1; defaults to, and is capped by, --max-lease-ttl",
        ),
    ] = None
    selector: Selector | None = None
    target: Target | None = None


class RenewRequest(BaseModel):
    model_config = _STRICT
    ttl_seconds: Annotated[
        TtlSeconds | None,
        Field(
            alias="ttlSeconds",
            description="at least 1; defaults to the lease's TTL; capped by --max-lease-ttl",
        ),
    ] = None


class ReportRequest(BaseModel):
    model_config = _STRICT
    outcome: Literal["ok", "blocked", "error"]
    target: Target | None = None


class GatewayReportRequest(BaseModel):
    """A report on the proxy a gateway session holds (docs/gateway.md): what a
    lease report is, for a client that cannot see the lease (a tunnel)."""

    model_config = _STRICT
    holder: Annotated[
        str,
        printable.text_field(
            MAX_GATEWAY_NAME, 1, "the holder: the proxy username before -session-"
        ),
        AfterValidator(printable.check_printable),
    ]
    session: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9._~-]+$",
            description="the session id of the username",
        ),
    ]
    outcome: Literal["ok", "blocked", "error"]
    target: Target | None = None


class LeaseProxy(BaseModel):
    name: str
    url: str = Field(description="http://user:pass@host:port; the only place credentials appear")


class LeaseAnswer(BaseModel):
    id: str
    holder: str
    proxy: LeaseProxy
    expires_at: str = Field(alias="expiresAt", description="RFC 3339, UTC")


class CooldownView(BaseModel):
    target: str = Field(description="a host name, or * for every target")
    until: str = Field(description="RFC 3339, UTC")


class ProxyView(BaseModel):
    name: str
    provider: str
    type: str
    zone: str | None
    labels: dict[str, str]
    health: Literal["unknown", "healthy", "unhealthy"]
    latency_ms: float | None = Field(alias="latencyMs")
    last_error: str | None = Field(alias="lastError")
    leased: bool
    cooldowns: list[CooldownView]


class ProxiesAnswer(BaseModel):
    proxies: list[ProxyView]


class LeaseHolder(BaseModel):
    holder: str
    expires_at: str = Field(alias="expiresAt", description="RFC 3339, UTC")


class GatewayUse(BaseModel):
    holder: str | None = Field(
        description="the gateway holder (with its session) that holds the proxy now, if any"
    )
    bytes_up: int = Field(alias="bytesUp", description="bytes sent through it by gateway clients")
    bytes_down: int = Field(alias="bytesDown", description="bytes received through it by them")


class StatusProxyView(ProxyView):
    lease: LeaseHolder | None = Field(description="who holds the proxy, until when")
    gateway: GatewayUse | None = Field(
        description="its use through this replica's gateway since it started (null: none)"
    )
    recent_ms: list[float | None] = Field(
        alias="recentMs",
        description="the latest probes' total times in ms, oldest first (null: failed)",
    )


class FleetTotals(BaseModel):
    proxies: int
    healthy: int
    unhealthy: int
    unknown: int
    leased: int
    cooling: int = Field(description="proxies with at least one cooldown")
    grants_per_minute: int = Field(
        alias="grantsPerMinute", description="leases this replica granted in the last 60 s"
    )


class StatusFilters(BaseModel):
    providers: list[str]
    zones: list[str]
    labels: list[str] = Field(description="key=value")
    states: list[str]


class ProbeTargetState(BaseModel):
    target: str = Field(description="HOST:PORT, as given to --probe-target")
    down: bool = Field(
        description="most attempts through the fleet could not reach it: its misses are "
        "not counted against the proxies (docs/discovery.md, 'A probe target down')"
    )


class FleetStatus(BaseModel):
    now: str = Field(description="the service's clock, RFC 3339, UTC")
    totals: FleetTotals = Field(description="over the whole fleet, whatever the filters")
    filters: StatusFilters = Field(description="the values each filter can take")
    matching: int = Field(description="proxies matching the filters")
    offset: int
    limit: int
    proxies: list[StatusProxyView] = Field(description="one page of the matching proxies")
    probe_targets: list[ProbeTargetState] = Field(
        alias="probeTargets", description="this replica's probe targets, in the order tried"
    )


class ProxySignals(BaseModel):
    name: str
    group: str = Field(description="the proxies[] entry it is a replica of (its name without -N)")
    health: Literal["unknown", "healthy", "unhealthy"]
    leased: bool
    blocked_sites: int = Field(
        alias="blockedSites",
        ge=0,
        description="distinct sites (report targets) that reported it blocked within the window",
    )
    blocks: int = Field(
        ge=0, description="`blocked` reports within the window, with or without a target"
    )
    last_blocked_at: str | None = Field(
        alias="lastBlockedAt", description="the latest of them, RFC 3339, UTC"
    )


class GroupSignals(BaseModel):
    name: str = Field(description="a proxies[] entry of the stack")
    proxies: int = Field(ge=0, description="its proxies in the fleet now")
    healthy: int = Field(ge=0, description="of those, probed healthy now")
    leased: int = Field(ge=0, description="of those, leased now")
    refused: int = Field(
        ge=0,
        description="grants refused (409) within the window whose selector matched a proxy of it",
    )
    refused_holders: int = Field(
        alias="refusedHolders", ge=0, description="distinct holders among those grants"
    )
    first_refused_at: str | None = Field(
        alias="firstRefusedAt", description="the first of them within the window, RFC 3339, UTC"
    )
    last_refused_at: str | None = Field(alias="lastRefusedAt", description="the latest of them")


class SignalsAnswer(BaseModel):
    now: str = Field(description="the store's clock, RFC 3339, UTC: the window ends here")
    window_seconds: int = Field(alias="windowSeconds", ge=1)
    proxies: list[ProxySignals] = Field(description="every proxy of the fleet, in manifest order")
    groups: list[GroupSignals] = Field(description="every group of the fleet")


class ErrorAnswer(BaseModel):
    error: str = Field(description="a stable code: bad_request, unauthorized, lease_not_found, ...")
    detail: str


class StatusAnswer(BaseModel):
    status: str
