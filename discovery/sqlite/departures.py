"""Fleet changes on the SQLite book: proxies that join, move or leave. A
proxy that leaves has its lease ended at once for crawlers (404) and, in
the store, as soon as it can record that, together with its cooldowns and
its last use (one write per round; retried while the store fails)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from discovery.book.contract import FleetChange
from discovery.book.errors import StoreError
from discovery.book.rules import fleet_diff
from discovery.fleet import Fleet
from discovery.logs import event
from discovery.metrics import Metrics
from discovery.sqlite.ledger import HeldLease, Ledger
from discovery.sqlite.ops import EndLease, ForgetProxy, Op, Write

log = logging.getLogger("discovery.leases")


class Departures:
    def __init__(
        self,
        ledger: Ledger,
        write: Write,
        metrics: Metrics,
        clock: Callable[[], float],
        retry_s: float,
    ) -> None:
        self._ledger = ledger
        self._write = write
        self._metrics = metrics
        self._clock = clock
        self._retry_s = retry_s
        self._forgetting: set[str] = set()  # departed proxies being written now
        self._forget_at = 0.0  # when to try again after a failed write

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        """Switches to a new fleet: leases of proxies that stay are kept (with the
        proxy's new address, if it moved); those of departed proxies end (404
        at once; in the store as soon as it can record it)."""
        ledger = self._ledger
        new = dict(fleet.proxies)
        diff = fleet_diff(ledger.fleet, new)
        ledger.fleet = new
        for name in diff.removed:
            ledger.pool.discard(name)
            ledger.departed.setdefault(name, [])
        for name in diff.added:
            # Back before the store forgot it, and the store holds nothing of it
            # that memory does not: nothing to forget. (Otherwise it stays out of
            # the pool until the forget is committed.)
            if name not in self._forgetting and not ledger.departed.get(name):
                ledger.departed.pop(name, None)
        for name in diff.changed:
            lease = ledger.by_proxy.get(name)
            if lease is not None:
                lease.proxy = new[name]
        ledger.health.set_fleet(p.endpoint() for p in new.values())
        for name in diff.added:
            ledger.sync_proxy(name)
        revoked = await self.forget(self._clock())
        return FleetChange(diff.added, diff.removed, diff.changed, revoked)

    async def forget_when_due(self, now: float) -> int:
        if self._ledger.departed and now >= self._forget_at:
            return await self.forget(now)
        return 0

    async def forget(self, now: float) -> int:
        """Ends the leases of proxies that left the fleet and drops their
        cooldowns and usage, in one write; returns how many leases ended."""
        ledger = self._ledger
        names = []
        for name in list(ledger.departed):
            if name in self._forgetting:
                continue
            if name in ledger.fleet and not ledger.departed[name]:
                del ledger.departed[name]  # back in the fleet: nothing left to forget
                ledger.sync_proxy(name)
                continue
            names.append(name)
        if not names:
            return 0
        ops: list[Op] = []
        ending: list[tuple[str, list[str], HeldLease | None, bool]] = []
        for name in names:
            orphans = ledger.departed[name]
            lease = ledger.by_proxy.get(name)
            marked = lease is not None and not lease.ending
            if lease is not None:
                lease.ending = True
            ops += [EndLease(lease_id) for lease_id in orphans]
            if lease is not None:
                ops.append(EndLease(lease.id))
            ops.append(ForgetProxy(name))
            ending.append((name, list(orphans), lease, marked))
        self._forgetting.update(names)
        try:
            await self._write(ops)
        except StoreError as exc:
            event(log, logging.WARNING, "lease revocation not recorded; retrying", error=str(exc))
            self._forget_at = self._clock() + self._retry_s
            for _, _, lease, marked in ending:
                if lease is not None and marked:
                    lease.ending = False
                    ledger.schedule(lease.expires_at, lease.id)
            return 0
        finally:
            self._forgetting.difference_update(names)
        revoked = 0
        for name, orphans, lease, _ in ending:
            ids = [*orphans, *([lease.id] if lease is not None else [])]
            if lease is not None:
                ledger.end(lease)
            for lease_id in ids:
                self._metrics.revoked.inc()
                event(log, logging.INFO, "lease revoked", lease=lease_id, proxy=name)
            revoked += len(ids)
            ledger.cooldowns.pop(name, None)
            ledger.last_used.pop(name, None)
            del ledger.departed[name]
            ledger.sync_proxy(name)  # back in the fleet meanwhile: free now
        return revoked


__all__ = ["Departures"]
