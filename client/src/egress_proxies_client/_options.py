"""The client's options and their defaults, each stated once (as httpx keeps
its own in `_config.py`): the pool, the httpx transports, the Scrapy
middleware and `alease()` read them from here, never restate them.

`$DISCOVERY_TOKEN` is read in one place too: `LeaseApi`, through
`token_or_env`, when no token is given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from egress_proxies_client._protocol import selector

TOKEN_VARIABLE = "DISCOVERY_TOKEN"

# alease() / lease(): one lease for a block of code, which has nothing else
# to do meanwhile, waits longer than one request of a crawl.
BLOCK_WAIT = 300.0


def token_or_env(token: str | None) -> str | None:
    """`token`, or `$DISCOVERY_TOKEN` when none is given ("" means none at all)."""
    return token if token is not None else os.environ.get(TOKEN_VARIABLE)


class PoolSettings(TypedDict, total=False):
    """The pool's keyword arguments (their defaults: `Options`)."""

    token: str | None  # the bearer token; None: $DISCOVERY_TOKEN
    provider: str | None  # the selector: only this provider's proxies,
    zone: str | None  # ... this zone's,
    labels: Mapping[str, str] | None  # ... with these labels
    ttl: float | None  # seconds per lease; None: the service's maximum
    per_site: int  # leases held per site at most
    wait: float  # seconds to wait for a proxy while none is free, then NoProxyAvailable
    idle: float | None  # a lease unused this long is given back; None: kept


@dataclass(frozen=True, kw_only=True)
class Options:
    """Every option of the pool and the rotating adapters, with its default.
    Valid once built: `per_site` >= 1, `ttl` > 0 or None, `wait` >= 0,
    `idle` >= 0 or None, `ban_retries` >= 0."""

    token: str | None = None
    provider: str | None = None
    zone: str | None = None
    labels: Mapping[str, str] | None = None
    ttl: float | None = None
    per_site: int = 1
    wait: float = 60.0
    idle: float | None = 60.0
    ban_retries: int = 5  # sends of one request through other proxies after bans

    def __post_init__(self) -> None:
        if self.per_site < 1:
            raise ValueError(f"per_site must be at least 1, got {self.per_site}")
        if self.ttl is not None and self.ttl <= 0:
            raise ValueError(f"ttl must be positive, got {self.ttl}")
        if self.wait < 0:
            raise ValueError(f"wait must not be negative, got {self.wait}")
        if self.idle is not None and self.idle < 0:
            raise ValueError(f"idle must not be negative (None: never), got {self.idle}")
        if self.ban_retries < 0:
            raise ValueError(f"ban_retries must not be negative, got {self.ban_retries}")

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> Options:
        """The options among `given` (an adapter's keyword arguments; its own
        keys are left out), defaults for the rest."""
        return cls(**{k: v for k, v in given.items() if k in cls.__dataclass_fields__})

    def selector(self) -> dict[str, Any]:
        return selector(self.provider, self.zone, self.labels)

    def pool_settings(self) -> PoolSettings:
        """What LeasePool takes of these."""
        return PoolSettings(
            token=self.token,
            provider=self.provider,
            zone=self.zone,
            labels=self.labels,
            ttl=self.ttl,
            per_site=self.per_site,
            wait=self.wait,
            idle=self.idle,
        )


DEFAULTS = Options()
