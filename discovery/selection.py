"""Which proxy a grant gets: selector matching, and the pool of free proxies
kept least recently used first, so use spreads over the whole fleet instead
of wearing out the first proxies of the manifest."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
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


class FreePool:
    """Names of the proxies that could be leased right now (in the fleet,
    healthy, not leased), least recently used first.

    A proxy coming back (released, expired, healthy again) queues at the
    back; one never used goes to the front. Cooldowns are per target, so
    they are checked at pick time, not kept out of the pool.
    """

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def add(self, name: str, *, never_used: bool = False) -> None:
        if name in self._order:
            return
        self._order[name] = None
        if never_used:
            self._order.move_to_end(name, last=False)

    def discard(self, name: str) -> None:
        self._order.pop(name, None)

    def pick(self, accept: Callable[[str], bool]) -> str | None:
        """Takes the first (least recently used) name `accept` agrees to."""
        for name in self._order:
            if accept(name):
                del self._order[name]
                return name
        return None

    def rebuild(self, names_by_last_use: list[tuple[float, str]]) -> None:
        """Replaces the pool with `names`, ordered by their last use (0: never)."""
        self._order = OrderedDict((name, None) for _, name in sorted(names_by_last_use))
