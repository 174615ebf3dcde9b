"""A fake lease book for the gateway's holds (discovery/gateway/holds.py) on a
controlled clock, shared by the unit tests of the holds and of the fleet
changes they follow (tests/unit/test_gateway_holds.py,
tests/unit/test_gateway_fleet.py). It grants proxies p0, p1, ... in turn and
keeps granting and renewing whatever it was made with, as a book that has not
switched to a new fleet yet does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from discovery.book.contract import Lease, Outcome
from discovery.book.errors import LeaseNotFound, NoProxyAvailable
from discovery.fleet import FleetProxy
from discovery.gateway.holds import Holds
from discovery.selection import Selector


@dataclass
class FakeBook:
    """Grants proxies p0, p1, ... in turn, with cooldowns per (proxy, host)."""

    proxies: int
    clock: Callable[[], float]
    ttl: float = 60.0
    leased: dict[str, Lease] = field(default_factory=dict)  # by lease id
    cooling_for: set[tuple[str, str]] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    _ids: int = 0

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        self.calls.append(f"grant {holder} {host}")
        busy = {lease.proxy.name for lease in self.leased.values()}
        for i in range(self.proxies):
            name = f"p{i}"
            if name not in busy and (name, host) not in self.cooling_for:
                self._ids += 1
                now = self.clock()
                proxy = FleetProxy(name, name, "kvm", "kvm", None, "127.0.0.1", 3128, {})
                lease = Lease(f"l{self._ids}", proxy, holder, host, self.ttl, now, now + self.ttl)
                self.leased[lease.id] = lease
                return lease
        raise NoProxyAvailable("leased", 5, "none free")

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        self.calls.append(f"renew {lease_id}")
        lease = self.leased.get(lease_id)
        if lease is None:
            raise LeaseNotFound(lease_id)
        lease.expires_at = self.clock() + self.ttl
        return lease

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        self.calls.append(f"report {lease_id} {outcome} {host}")
        lease = self.leased[lease_id]
        if outcome == "blocked" and host:
            self.cooling_for.add((lease.proxy.name, host))

    async def release(self, lease_id: str) -> None:
        self.calls.append(f"release {lease_id}")
        if self.leased.pop(lease_id, None) is None:
            raise LeaseNotFound(lease_id)

    async def cooling(self, lease_id: str, host: str) -> bool:
        return (self.leased[lease_id].proxy.name, host) in self.cooling_for


def run(
    scenario: Callable[[FakeBook, Holds, list[float]], Coroutine[Any, Any, None]],
    proxies: int = 3,
    **options: Any,
) -> None:
    now = [1000.0]
    book = FakeBook(proxies, lambda: now[0])
    holds = Holds(lambda: book, clock=lambda: now[0], **options)  # type: ignore[arg-type, return-value]
    asyncio.run(scenario(book, holds, now))
