"""The SQLite book's memory: who holds which proxy until when, which proxies
cool down for which targets, when each was last leased, the free pool and
the expiry heap, with the transitions between them. Nothing here writes to
the store or awaits; book.py decides when a change is committed."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from discovery.book.contract import Lease
from discovery.book.rules import Candidate, available, cooling_until
from discovery.fleet import FleetProxy
from discovery.health_source import HealthSource
from discovery.metrics import StateSnapshot
from discovery.sqlite.ops import LeaseRecord
from discovery.sqlite.pool import FreePool
from health.model import Health

# The expiry heap's stale entries are dropped when it outgrows twice its
# size after the last drop plus this (Ledger.schedule).
EXPIRY_SLACK = 1024


@dataclass(slots=True)
class HeldLease(Lease):
    # Writes in flight (see book.py's docstring):
    committed: bool = True  # False while its grant is not yet committed
    renewals: int = 0  # renewals queued, not yet committed
    ending: bool = False  # a release, expiry or revocation queued, not yet committed

    def record(self, ttl: float | None = None, expires_at: float | None = None) -> LeaseRecord:
        return LeaseRecord(
            self.id,
            self.proxy.name,
            self.holder,
            self.target,
            self.ttl if ttl is None else ttl,
            self.granted_at,
            self.expires_at if expires_at is None else expires_at,
        )


class Ledger:
    def __init__(self, health: HealthSource) -> None:
        self.health = health
        self.fleet: dict[str, FleetProxy] = {}
        self.leases: dict[str, HeldLease] = {}
        self.by_proxy: dict[str, HeldLease] = {}
        self.cooldowns: dict[str, dict[str, float]] = {}  # proxy -> target -> until
        self.last_used: dict[str, float] = {}
        self.pool = FreePool()
        # Proxies that left the fleet and are not yet forgotten by the store
        # (their lease ended, cooldowns and usage dropped), with the ids of
        # stored leases on them that memory never held (found at restore).
        self.departed: dict[str, list[str]] = {}
        self._expiry: list[tuple[float, str]] = []  # heap; entries may be stale
        self._compact_at = EXPIRY_SLACK  # heap size at which stale entries are dropped

    # -- the free pool -------------------------------------------------------------------

    def healthy(self, name: str) -> bool:
        return self.health.verdict(name) == Health.HEALTHY

    def free(self, name: str) -> bool:
        """Whether `name` belongs in the free pool: in the fleet, not departing,
        and rules.available (healthy, no lease)."""
        if name not in self.fleet or name in self.departed:
            return False
        lease = self.by_proxy.get(name)
        leased_until = lease.expires_at if lease is not None else None
        return available(Candidate(name, self.healthy(name), leased_until, None))

    def sync_proxy(self, name: str) -> None:
        """Puts `name` in the free pool or takes it out, per the engine's current view."""
        if self.free(name):
            self.pool.add(name, self.last_used.get(name))
        else:
            self.pool.discard(name)

    def resync_pool(self) -> None:
        """Rebuilds the free pool from the engine's view (the start-up fill)."""
        self.pool.rebuild(
            (name, self.last_used.get(name)) for name in self.fleet if self.free(name)
        )

    # -- leases --------------------------------------------------------------------------

    def live(self, lease_id: str, now: float) -> HeldLease | None:
        """The lease, if a crawler may still use it: committed, not past its
        time, not ending, its proxy still in the fleet."""
        lease = self.leases.get(lease_id)
        if (
            lease is None
            or lease.expires_at <= now
            or lease.ending
            or not lease.committed
            or lease.proxy.name not in self.fleet
            or lease.proxy.name in self.departed
        ):
            return None
        return lease

    def add(self, lease: HeldLease) -> None:
        self.leases[lease.id] = lease
        self.by_proxy[lease.proxy.name] = lease
        self.pool.discard(lease.proxy.name)
        self.schedule(lease.expires_at, lease.id)

    def end(self, lease: HeldLease) -> None:
        """Drops `lease` (if still held) and frees its proxy, in its place by
        its last use."""
        if self.leases.get(lease.id) is not lease:
            return
        del self.leases[lease.id]
        name = lease.proxy.name
        if self.by_proxy.get(name) is lease:
            del self.by_proxy[name]
            if self.free(name):
                self.pool.add(name, self.last_used.get(name))

    def schedule(self, at: float, lease_id: str) -> None:
        """Lets the sweep look at `lease_id` at `at`. Entries of leases that
        ended meanwhile are skipped when due, but until then each is an
        object in memory and in the garbage collector's young generation
        (a lease's time is minutes, a grant+release pair milliseconds: a
        few hundred thousand of them at a steady 1,000 pairs/s). So they are
        dropped once the heap has grown to twice what it held after the last
        drop: O(1) per entry, amortized."""
        heapq.heappush(self._expiry, (at, lease_id))
        if len(self._expiry) > self._compact_at:
            leases = self.leases
            self._expiry = [entry for entry in self._expiry if entry[1] in leases]
            heapq.heapify(self._expiry)
            self._compact_at = 2 * len(self._expiry) + EXPIRY_SLACK

    def due(self, now: float) -> list[HeldLease]:
        """Marks the leases due at `now` ending, for one write."""
        due: list[HeldLease] = []
        while self._expiry and self._expiry[0][0] <= now:
            _, lease_id = heapq.heappop(self._expiry)
            lease = self.leases.get(lease_id)
            if lease is None or lease.expires_at > now:
                continue  # released, or renewed (a later entry stands for it)
            if lease.ending or lease.renewals or not lease.committed:
                continue  # a write in flight decides; it puts the lease back in the heap
            lease.ending = True
            due.append(lease)
        return due

    def next_expiry(self) -> float | None:
        return self._expiry[0][0] if self._expiry else None

    def expiry_entries(self) -> int:
        return len(self._expiry)

    # -- cooldowns and refusals ----------------------------------------------------------

    def cooling_until(self, name: str, scopes: Sequence[str], now: float) -> float | None:
        cooldowns = self.cooldowns.get(name)
        return cooling_until(cooldowns, scopes, now) if cooldowns else None

    def candidate(self, name: str, scopes: Sequence[str], now: float) -> Candidate:
        """Where `name` stands for a grant whose cooldown scopes are `scopes`.
        A lease past its time still holds its proxy until its end is committed."""
        lease = self.by_proxy.get(name)
        return Candidate(
            name,
            self.healthy(name),
            lease.expires_at if lease is not None else None,
            self.cooling_until(name, scopes, now),
        )

    def snapshot(self, now: float) -> StateSnapshot:
        verdict = self.health.verdict
        counts = Counter(verdict(name) or Health.UNKNOWN for name in self.fleet)
        by_health = {str(h): counts[h] for h in Health}
        cooling = sum(
            1 for scopes in self.cooldowns.values() for until in scopes.values() if until > now
        )
        return StateSnapshot(len(self.leases), cooling, by_health)


__all__ = ["EXPIRY_SLACK", "HeldLease", "Ledger"]
