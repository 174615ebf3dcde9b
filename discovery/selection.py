"""Which proxies a grant may get: the selector a crawler sends, matched
against the fleet (the PostgreSQL store says the same in SQL)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from discovery.fleet import FleetProxy


@dataclass(frozen=True)
class Selector:
    """Every given field must match; `labels` must all be present with these values."""

    provider: str | None = None
    zone: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.provider is None and self.zone is None and not self.labels

    def matches(self, proxy: FleetProxy) -> bool:
        if self.provider is not None and proxy.provider != self.provider:
            return False
        if self.zone is not None and proxy.zone != self.zone:
            return False
        return all(proxy.labels.get(k) == v for k, v in self.labels.items())
