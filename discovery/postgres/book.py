"""The lease book on PostgreSQL (store.py): any replica can renew, report or
release a lease another one granted, on a proxy of its own fleet
(fleets.py), and the refusal (409) is computed from the database's view.

As on SQLite, the book decides and the store reads and writes: a grant's
lifetime and eligibility, a renewal's TTL, a report's effect and how its
cooldown merges with the proxy's, whether a proxy cools down for a site and
why a grant is refused are the rules of discovery/book/rules.py, applied
here to what the store read, inside the store's transaction where the
decision must see the database unchanged until it is written.

404 means the lease has ended, for good: a lease this replica cannot touch
because its fleet lacks the proxy is ended when it answers 404 for it, so
that the proxy coming back (a fleet swapped back, another replica's older
fleet) never revives it. SQLite ends such leases at the fleet change."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from discovery.book.contract import FleetChange, Lease, LeaseRecord, Outcome
from discovery.book.errors import LeaseNotFound, StoreError, StoreOverloaded, StoreUnavailable
from discovery.book.rules import (
    REPORT_RETENTION_S,
    REPORTS_KEPT,
    Candidate,
    Cooldown,
    LeaseIds,
    Terms,
    cap_ttl,
    cooldown_scopes,
    cooling_until,
    eligibility,
    fleet_diff,
    is_lease_id,
    merge_cooldown,
    refusal,
    renewal_ttl,
    report_effect,
)
from discovery.book.signals import (
    REFUSAL_RETENTION_S,
    REFUSALS_KEPT,
    SignalCounts,
    groups_of,
)
from discovery.book.views import ProxyDetail, proxy_json, taking_turns
from discovery.fleet import Fleet, FleetProxy
from discovery.logs import event
from discovery.metrics import Metrics, StateSnapshot
from discovery.postgres import fleets
from discovery.postgres.batches import Batches
from discovery.postgres.conflicts import retrying
from discovery.postgres.prober import Prober
from discovery.postgres.rows import GrantRow
from discovery.postgres.store import Pick, PostgresStore, StoreBusy, eligibility_key
from discovery.selection import Selector
from health.model import Health

log = logging.getLogger("discovery.shared")

T = TypeVar("T")

# Grants in one transaction before a grant under contention gives up (503).
GRANT_ATTEMPTS = 8
# Requests one statement serves at most (batches.py); and statements of one
# kind in flight at once: a request that finds them all busy waits for the
# next, which serves it with the others that came meanwhile.
GRANTS_PER_STATEMENT = 64
RELEASES_PER_STATEMENT = 128
STATEMENTS_IN_FLIGHT = 1


class PostgresBook:
    def __init__(
        self,
        *,
        store: PostgresStore,
        probes: Prober,
        metrics: Metrics,
        terms: Terms,
    ) -> None:
        self._store = store
        self._probes = probes  # told this replica's fleet; probes its share of every fleet
        self._metrics = metrics
        self._terms = terms
        self._fleet: dict[str, FleetProxy] = {}
        self._new_id = LeaseIds()
        self._snapshot = StateSnapshot(0, 0, {str(h): 0 for h in Health})
        self._grants = Batches(
            self._grant_batch, most=GRANTS_PER_STATEMENT, in_flight=STATEMENTS_IN_FLIGHT
        )
        self._releases = Batches(
            self._release_batch, most=RELEASES_PER_STATEMENT, in_flight=STATEMENTS_IN_FLIGHT
        )

    # -- fleet ---------------------------------------------------------------------------

    async def restore(self, fleet: Fleet) -> None:
        """Registers this replica's fleet (adds and tags; removes nothing:
        another replica may still serve an older fleet, fleets.py)."""
        proxies = dict(fleet.proxies)
        tag = fleets.digest(proxies)
        await self._call(fleets.register(self._store, tag, list(proxies.values()), ()))
        self._fleet, self._store.fleet = proxies, tag
        self._probes.serve(p.endpoint() for p in self._fleet.values())
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
        self._probes.serve(p.endpoint() for p in new.values())
        self._metrics.revoked.inc(revoked)
        return FleetChange(diff.added, diff.removed, diff.changed, revoked)

    def on_health_change(self, name: str, health: Health) -> None:
        """Health reaches this book through the database (each proxy's prober writes it)."""

    async def maintain(self) -> None:
        """Registers this fleet again (a guard against a replica with an older
        fleet that removed proxies this one still serves), drops fleets no
        replica serves any more, prunes cooldowns and reports."""
        proxies = list(self._fleet.values())
        await self._call(fleets.ensure(self._store, self._store.fleet, proxies))
        self._metrics.revoked.inc(await self._call(fleets.forget_dead(self._store)))
        await self._call(self._store.prune(REPORT_RETENTION_S, REPORTS_KEPT))
        await self._call(self._store.prune_refusals(REFUSAL_RETENTION_S, REFUSALS_KEPT))

    # -- the API's operations ------------------------------------------------------------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        wanted = eligibility(selector, host)
        pick = Pick(self._new_id(), holder, host, cap_ttl(ttl, self._terms.max_ttl), wanted)
        row = await self._call(self._take(pick))
        if row is None:
            now, rows = await self._call(self._store.candidates(wanted))
            candidates = [
                Candidate(
                    r.name,
                    r.health == Health.HEALTHY,
                    r.leased_until,
                    cooling_until(r.cooldowns, wanted.scopes, now),
                )
                for r in rows
            ]
            denial = refusal(candidates, host, now, self._terms.probe_interval)
            self._metrics.denied.labels(denial.reason).inc()
            groups = groups_of(r.name for r in rows)
            if groups:
                # Counted for the autopilot; one that fails leaves the 409 as it is.
                with contextlib.suppress(StoreUnavailable):
                    await self._call(self._store.add_refusals(groups, holder))
            raise denial
        if row.replaced:  # the proxy's expired lease ended here, not in a sweep
            self._metrics.expired.inc()
        self._metrics.grant()
        event(log, logging.DEBUG, "lease granted", lease=row.id, proxy=row.proxy, holder=holder)
        return self._lease(row)

    async def _take(self, pick: Pick) -> GrantRow | None:
        """The lease `pick` asks for; None when no proxy is eligible."""
        # The usual case: one statement, shared with the grants that ask the same.
        row = await self._grants.submit(eligibility_key(pick.wanted), pick)
        if row is not None:
            return row
        async with self._store.transaction() as db:
            for _ in range(GRANT_ATTEMPTS):
                [row] = await db.grant([pick])
                if row is not None:
                    return row
                # Nothing picked: every eligible proxy was being taken by other
                # grants (skipped), or there is none. One that is free and no
                # longer held by another grant is locked for this one now, and
                # the next pick (a new snapshot) takes it or a better one.
                if not await db.lock_one_free(pick):
                    return None
        raise StoreError(f"no grant after {GRANT_ATTEMPTS} attempts under contention")

    async def _grant_batch(self, _key: str, picks: Sequence[Pick]) -> list[GrantRow | None]:
        async def once() -> list[GrantRow | None]:
            async with self._store.statements() as db:
                return await db.grant(picks)

        return await retrying(once)

    async def _release_batch(self, _key: None, lease_ids: Sequence[str]) -> list[str | None]:
        return await self._store.release(lease_ids)

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        self._known(lease_id)
        row = await self._call(self._renew(lease_id, ttl))
        if row is None:
            raise await self._not_found(lease_id)
        return self._lease(row)

    async def _renew(self, lease_id: str, ttl: float | None) -> LeaseRecord | None:
        async with self._store.transaction() as db:
            lease = await db.live_lease(lease_id)
            if lease is None:
                return None
            return await db.renew(lease_id, renewal_ttl(ttl, lease.ttl, self._terms.max_ttl))

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        self._known(lease_id)
        found = await self._call(self._report(lease_id, outcome, host))
        if found is None:
            raise await self._not_found(lease_id)
        proxy, cooldown = found
        if cooldown is not None:
            event(
                log,
                logging.INFO,
                "proxy cooling down",
                proxy=proxy,
                target=cooldown.target,
                until=cooldown.until,
            )
        self._metrics.reports.labels(outcome).inc()

    async def _report(
        self, lease_id: str, outcome: Outcome, host: str | None
    ) -> tuple[str, Cooldown | None] | None:
        """Records a report on a live lease of this fleet with its effect, in
        one transaction; the proxy and the cooldown it is under now, if the
        report started one. None: no such lease."""
        async with self._store.transaction() as db:
            lease = await db.live_lease(lease_id)  # locked: reports on it take turns
            if lease is None:
                return None
            effect = report_effect(outcome, host, self._terms.cooldown, lease.now)
            await db.add_report(lease, outcome, host)
            merged = None
            if effect.cooldown is not None:
                scopes = await db.cooldowns_of(lease.proxy)
                wanted = effect.cooldown.target
                target = merge_cooldown(scopes, wanted, effect.cooldown.until, lease.now)
                if target != wanted:  # widened: one cooldown everywhere instead
                    await db.drop_cooldowns(lease.proxy)
                merged = Cooldown(target, scopes[target])
                await db.put_cooldown(lease.proxy, merged.target, merged.until)
            if effect.error is not None:
                await db.add_error(lease.proxy, effect.error)  # the proxy's prober counts it
            return lease.proxy, merged

    async def release(self, lease_id: str) -> None:
        self._known(lease_id)
        proxy = await self._call(self._releases.submit(None, lease_id))
        if proxy is None:
            raise await self._not_found(lease_id)
        self._metrics.released.inc()
        event(log, logging.DEBUG, "lease released", lease=lease_id, proxy=proxy)

    async def cooling(self, lease_id: str, host: str) -> bool:
        self._known(lease_id)
        found = await self._call(self._store.lease_cooldowns(lease_id))
        if found is None:
            raise await self._not_found(lease_id)
        return cooling_until(found.scopes, cooldown_scopes(host), found.now) is not None

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

    async def signals(self, window: float) -> SignalCounts:
        return await self._call(self._store.count_signals(window))

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

    async def _not_found(self, lease_id: str) -> LeaseNotFound:
        """The 404 for a lease that is no live lease of this fleet's: one
        that lives on a proxy this fleet lacks ends now (see the module)."""
        proxy = await self._call(self._store.end_foreign(lease_id))
        if proxy is not None:
            self._metrics.revoked.inc()
            event(
                log,
                logging.INFO,
                "lease ended: its proxy is not in this replica's fleet",
                lease=lease_id,
                proxy=proxy,
            )
        return LeaseNotFound(lease_id)

    def _lease(self, row: LeaseRecord) -> Lease:
        proxy = self._fleet.get(row.proxy)
        if proxy is None:  # tagged with this fleet, so in it; a fleet change racing
            raise LeaseNotFound(row.id)
        return Lease(row.id, proxy, row.holder, row.target, row.ttl, row.granted_at, row.expires_at)

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except StoreBusy:  # load, not an outage (logged by the store, once in a while)
            raise StoreOverloaded("the lease store is busy; try again") from None
        except StoreError as error:
            event(log, logging.ERROR, "shared store unavailable", error=str(error))
            raise StoreUnavailable("the lease store is unavailable; try again") from None


__all__ = ["GRANT_ATTEMPTS", "PostgresBook"]
