"""The lease book on PostgreSQL (store.py): any replica can renew, report or
release a lease another one granted, on a proxy of its own fleet
(fleets.py), and the refusal (409) is computed from the database's view."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from discovery.book.contract import FleetChange, Lease, LeaseRecord, Outcome
from discovery.book.errors import LeaseNotFound, StoreError, StoreUnavailable
from discovery.book.rules import (
    REPORT_RETENTION_S,
    REPORTS_KEPT,
    Candidate,
    LeaseIds,
    Terms,
    cap_ttl,
    cooldown_scopes,
    fleet_diff,
    is_lease_id,
    refusal,
)
from discovery.book.views import ProxyDetail, proxy_json, taking_turns
from discovery.fleet import Fleet, FleetProxy
from discovery.health_source import HealthSource
from discovery.logs import event
from discovery.metrics import Metrics, StateSnapshot
from discovery.postgres import fleets
from discovery.postgres.store import PostgresStore
from discovery.selection import Selector
from health.model import Health

log = logging.getLogger("discovery.shared")

T = TypeVar("T")


class PostgresBook:
    def __init__(
        self,
        *,
        store: PostgresStore,
        health: HealthSource,
        metrics: Metrics,
        terms: Terms,
    ) -> None:
        self._store = store
        self._health = health
        self._metrics = metrics
        self.terms = terms
        self._fleet: dict[str, FleetProxy] = {}
        self._new_id = LeaseIds()
        self._snapshot = StateSnapshot(0, 0, {str(h): 0 for h in Health})

    # -- fleet ---------------------------------------------------------------------------

    async def restore(self, fleet: Fleet) -> None:
        """Registers this replica's fleet (adds and tags; removes nothing:
        another replica may still serve an older fleet, fleets.py)."""
        proxies = dict(fleet.proxies)
        tag = fleets.digest(proxies)
        await self._call(fleets.register(self._store, tag, list(proxies.values()), ()))
        self._fleet, self._store.fleet = proxies, tag
        self._health.set_fleet(p.endpoint() for p in self._fleet.values())
        event(log, logging.INFO, "fleet registered in the shared store", proxies=len(self._fleet))

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        new = dict(fleet.proxies)
        diff = fleet_diff(self._fleet, new)
        tag = fleets.digest(new)
        revoked = await self._call(
            fleets.register(self._store, tag, list(new.values()), diff.removed)
        )
        # Both at once: a grant never sees a proxy tagged for a fleet it lacks.
        self._fleet, self._store.fleet = new, tag
        self._health.set_fleet(p.endpoint() for p in new.values())
        self._metrics.revoked.inc(revoked)
        return FleetChange(diff.added, diff.removed, diff.changed, revoked)

    def on_health_change(self, name: str, health: Health) -> None:
        """Health reaches this book through the database (the leader writes it)."""

    async def maintain(self) -> None:
        """Registers this fleet again (a guard against a replica with an older
        fleet that removed proxies this one still serves), drops fleets no
        replica serves any more, prunes cooldowns and reports."""
        proxies = list(self._fleet.values())
        await self._call(fleets.register(self._store, self._store.fleet, proxies, ()))
        self._metrics.revoked.inc(await self._call(fleets.forget_dead(self._store)))
        await self._call(self._store.prune(REPORT_RETENTION_S, REPORTS_KEPT))

    # -- the API's operations ------------------------------------------------------------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        lifetime = cap_ttl(ttl, self.terms.max_ttl)
        row = await self._call(self._store.grant(self._new_id(), holder, lifetime, host, selector))
        if row is None:
            now, rows = await self._call(self._store.candidates(selector, host))
            candidates = [
                Candidate(r.name, r.healthy, r.leased_until, r.cooling_until) for r in rows
            ]
            denial = refusal(candidates, host, now, self.terms.probe_interval)
            self._metrics.denied.labels(denial.reason).inc()
            raise denial
        if row.replaced:  # the proxy's expired lease ended here, not in a sweep
            self._metrics.expired.inc()
        self._metrics.grant()
        event(log, logging.DEBUG, "lease granted", lease=row.id, proxy=row.proxy, holder=holder)
        return self._lease(row)

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        self._known(lease_id)
        lifetime = cap_ttl(ttl, self.terms.max_ttl) if ttl is not None else None
        row = await self._call(self._store.renew(lease_id, lifetime, self.terms.max_ttl))
        if row is None:
            raise LeaseNotFound(lease_id)
        return self._lease(row)

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        self._known(lease_id)
        found = await self._call(self._store.report(lease_id, outcome, host, self.terms.cooldown))
        if found is None:
            raise LeaseNotFound(lease_id)
        lease, scope, until = found
        if until is not None:
            event(
                log,
                logging.INFO,
                "proxy cooling down",
                proxy=lease.proxy,
                target=scope,
                until=until,
            )
        self._metrics.reports.labels(outcome).inc()

    async def release(self, lease_id: str) -> None:
        self._known(lease_id)
        proxy = await self._call(self._store.release(lease_id))
        if proxy is None:
            raise LeaseNotFound(lease_id)
        self._metrics.released.inc()
        event(log, logging.DEBUG, "lease released", lease=lease_id, proxy=proxy)

    async def cooling(self, lease_id: str, host: str) -> bool:
        self._known(lease_id)
        found = await self._call(self._store.cooling(lease_id, cooldown_scopes(host)))
        if found is None:
            raise LeaseNotFound(lease_id)
        return found

    async def expire_due(self) -> int:
        ended = await self._call(self._store.expire())
        self._metrics.expired.inc(ended)
        return ended

    def next_expiry(self) -> float | None:
        return None  # the database knows; the service sweeps on a tick

    # -- views ---------------------------------------------------------------------------

    async def proxies_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """The fleet as the database sees it: the same answer on every replica
        that serves this fleet."""
        now, rows, cooldowns = await self._call(self._store.proxies())
        scopes: dict[str, list[tuple[float, str]]] = {}
        for c in cooldowns:
            scopes.setdefault(c.proxy, []).append((c.until, c.target))
        answer = []
        async for name, proxy in taking_turns(list(self._fleet.items())):
            row = rows.get(name)
            lease = None
            if row is not None and row.holder is not None and row.expires_at is not None:
                lease = (row.holder, row.expires_at)
            answer.append(
                proxy_json(
                    proxy,
                    health=row.health if row else str(Health.UNKNOWN),
                    latency_ms=row.latency_ms if row else None,
                    last_error=row.last_error if row else None,
                    leased=lease is not None,
                    cooldowns=[(u, t) for u, t in scopes.get(name, ()) if u > now],
                    detail=ProxyDetail(lease, tuple(row.recent_ms) if row else ())
                    if detail
                    else None,
                )
            )
        return answer

    async def refresh_snapshot(self) -> None:
        counts = await self._call(self._store.gauges())
        by_health = {str(h): 0 for h in Health}
        for count in counts:
            by_health[count.health] += count.proxies
        # A proxy of the fleet without a row yet (a fleet change in flight) is unknown.
        by_health[str(Health.UNKNOWN)] += len(self._fleet) - sum(c.proxies for c in counts)
        leased = sum(c.leased for c in counts)
        cooling = sum(c.cooling for c in counts)
        self._snapshot = StateSnapshot(leased, cooling, by_health)

    def snapshot(self) -> StateSnapshot:
        return self._snapshot

    # -- internals -----------------------------------------------------------------------

    def _known(self, lease_id: str) -> None:
        """An id no grant could have made is no lease: not sent to the database."""
        if not is_lease_id(lease_id):
            raise LeaseNotFound(lease_id)

    def _lease(self, row: LeaseRecord) -> Lease:
        proxy = self._fleet.get(row.proxy)
        if proxy is None:  # tagged with this fleet, so in it; a fleet change racing
            raise LeaseNotFound(row.id)
        return Lease(row.id, proxy, row.holder, row.target, row.ttl, row.granted_at, row.expires_at)

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except StoreError as error:
            event(log, logging.ERROR, "shared store unavailable", error=str(error))
            raise StoreUnavailable("the lease store is unavailable; try again") from None


__all__ = ["PostgresBook"]
