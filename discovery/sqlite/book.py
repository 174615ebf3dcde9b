"""The lease book on SQLite: the state lives in memory (ledger.py) and changes
only on the event loop, synchronously: the check that a proxy is free and
the act of taking it happen without an `await` in between, which is what
makes leases exclusive under any number of concurrent requests. Each change
is queued to the store in that same step (so the store sees changes in the
order they happened) and the caller answers only after the store has
committed it.

A write that fails changes nothing, in memory or on disk. Memory takes a
change only once the store has committed it, and until then the change
holds what it needs so that nothing else can contradict it:

- a grant reserves its proxy at once (it is leased for every other grant)
  and becomes a lease when committed; a failed one frees the proxy again;
- a release, an expiry or a revocation marks its lease *ending*: renew,
  report and release answer 404 and no grant takes the proxy until the end
  is committed; if it fails, the lease is as it was (an expiry or a
  revocation is tried again later, a release is the crawler's to repeat);
- a renewal or a cooldown is applied when committed. Commits and their
  continuations run in queue order, so memory applies changes in the order
  the store did.

(The alternative, changing memory first and undoing it on failure, cannot
undo exactly once changes interleave: a proxy released, granted again and
then the release failing. docs/architecture.md, decision log.)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from discovery.book.contract import FleetChange, Lease, Outcome
from discovery.book.errors import LeaseNotFound, StoreError, StoreUnavailable
from discovery.book.rules import (
    REPORT_RETENTION_S,
    LeaseIds,
    Terms,
    available,
    cap_ttl,
    cooldown_scopes,
    eligibility,
    eligible,
    is_lease_id,
    merge_cooldown,
    refusal,
    renewal_ttl,
    report_effect,
)
from discovery.book.signals import REFUSAL_RETENTION_S, SignalCounts, groups_of
from discovery.book.views import ProxyDetail, proxy_json, taking_turns
from discovery.fleet import Fleet
from discovery.health_source import HealthSource
from discovery.logs import event
from discovery.metrics import Metrics, StateSnapshot
from discovery.selection import Selector
from discovery.sqlite.departures import Departures
from discovery.sqlite.ledger import HeldLease, Ledger
from discovery.sqlite.ops import (
    AddReport,
    CooldownRecord,
    EndLease,
    Op,
    Prune,
    PutCooldown,
    PutLease,
    ReportRecord,
    StoredState,
    Write,
)
from discovery.sqlite.tally import Tally
from health.model import Health

log = logging.getLogger("discovery.leases")

# How long an expiry or a revocation the store could not record waits before
# it is tried again.
RETRY_S = 1.0


class SqliteBook:
    def __init__(
        self,
        *,
        write: Write,
        health: HealthSource,
        metrics: Metrics,
        terms: Terms,
        clock: Callable[[], float] = time.time,
        tally: Tally | None = None,
    ) -> None:
        self._write = write  # the store's (SqliteStore.write), durable once awaited
        self._tally = tally  # refusals and the signals' counts (None: not kept)
        self._health = health
        self._metrics = metrics
        self._terms = terms
        self._clock = clock
        self.ledger = Ledger(health)
        self._new_id = LeaseIds()
        self._departures = Departures(self.ledger, write, metrics, clock, RETRY_S)

    # -- startup and fleet ---------------------------------------------------------------

    async def restore(self, state: StoredState, fleet: Fleet) -> None:
        """Takes over the stored state for `fleet`: leases and cooldowns of proxies
        still in it survive; expired leases and those of departed proxies end."""
        ledger, now = self.ledger, self._clock()
        ledger.fleet = dict(fleet.proxies)
        ledger.last_used = {k: v for k, v in state.last_used.items() if k in ledger.fleet}
        known = {c.proxy for c in state.cooldowns} | set(state.last_used)
        for name in known - set(ledger.fleet):
            ledger.departed.setdefault(name, [])
        expired = 0
        for record in state.leases:
            proxy = ledger.fleet.get(record.proxy)
            if proxy is None:
                ledger.departed.setdefault(record.proxy, []).append(record.id)
                continue
            # Expired ones too: the first sweep (below) ends them, or retries.
            expired += record.expires_at <= now
            ledger.add(
                HeldLease(
                    record.id,
                    proxy,
                    record.holder,
                    record.target,
                    record.ttl,
                    record.granted_at,
                    record.expires_at,
                )
            )
        for cooldown in state.cooldowns:
            if cooldown.proxy in ledger.fleet and cooldown.until > now:
                ledger.cooldowns.setdefault(cooldown.proxy, {})[cooldown.target] = cooldown.until
        self._health.set_fleet(p.endpoint() for p in ledger.fleet.values())
        ledger.resync_pool()
        event(
            log,
            logging.INFO,
            "state restored",
            leases=len(ledger.leases) - expired,
            expired=expired,
            departed=len(ledger.departed),
            cooldowns=sum(len(c) for c in ledger.cooldowns.values()),
            proxies=len(ledger.fleet),
        )
        await self.expire_due()

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        return await self._departures.apply_fleet(fleet)

    def on_health_change(self, name: str, health: Health) -> None:
        """HealthListener: keeps the free pool in step with the engine."""
        if name not in self.ledger.fleet:
            return
        # The engine logs each change at info already.
        event(log, logging.DEBUG, "proxy health changed", proxy=name, health=str(health))
        self.ledger.sync_proxy(name)

    # -- the API's operations ------------------------------------------------------------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        ledger, now = self.ledger, self._clock()
        # Leases past their time free their proxies now, not at the next sweep
        # (once their end is committed: a failure leaves them to the sweep).
        expired = ledger.due(now)
        if expired:
            await self._end_expired(expired, now)
            now = self._clock()
        wanted = eligibility(selector, host)
        stale: list[str] = []

        def takes(name: str) -> bool:
            proxy = ledger.fleet.get(name)
            if proxy is None:
                stale.append(name)
                return False
            candidate = ledger.candidate(name, wanted.scopes, now)
            if not available(candidate):
                stale.append(name)  # a missed health event: it does not belong here
                return False
            return eligible(wanted, proxy, candidate)

        name = ledger.pool.pick(takes)
        for gone in stale:
            ledger.pool.discard(gone)
        if name is None:
            candidates = [
                ledger.candidate(n, wanted.scopes, now)
                for n, p in ledger.fleet.items()
                if selector.matches(p)
            ]
            denial = refusal(candidates, host, now, self._terms.probe_interval)
            self._metrics.denied.labels(denial.reason).inc()
            if self._tally is not None:
                self._tally.refused(now, groups_of(c.name for c in candidates), holder)
            raise denial
        lifetime = cap_ttl(ttl, self._terms.max_ttl)
        lease = HeldLease(
            self._new_id(), ledger.fleet[name], holder, host, lifetime, now, now + lifetime
        )
        lease.committed = False
        ledger.add(lease)  # reserved: no other grant takes the proxy from here on
        try:
            await self._write((PutLease(lease.record()),))
        except StoreError:
            ledger.end(lease)  # its proxy is free again, in its place (its last use unchanged)
            raise StoreUnavailable("the lease store could not record the grant") from None
        lease.committed = True
        ledger.last_used[name] = now
        ledger.schedule(lease.expires_at, lease.id)
        self._metrics.grant()
        event(log, logging.DEBUG, "lease granted", lease=lease.id, proxy=name, holder=holder)
        return lease

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        now = self._clock()
        lease = self._live(lease_id, now)
        lifetime = renewal_ttl(ttl, lease.ttl, self._terms.max_ttl)
        expires_at = now + lifetime
        lease.renewals += 1  # the sweep leaves it alone until this is decided
        try:
            await self._write((PutLease(lease.record(lifetime, expires_at)),))
        except StoreError:
            raise StoreUnavailable("the lease store could not record the renewal") from None
        else:
            lease.ttl, lease.expires_at = lifetime, expires_at
        finally:
            lease.renewals -= 1
            self.ledger.schedule(lease.expires_at, lease.id)
        event(log, logging.DEBUG, "lease renewed", lease=lease.id, proxy=lease.proxy.name)
        return lease

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        now = self._clock()
        lease = self._live(lease_id, now)
        name = lease.proxy.name
        effect = report_effect(outcome, host, self._terms.cooldown, now)
        ops: list[Op] = [AddReport(ReportRecord(now, lease.id, name, lease.holder, outcome, host))]
        if effect.cooldown is not None:
            # The store merges it into what it holds as it commits (schema.py).
            cooldown = effect.cooldown
            ops.append(PutCooldown(CooldownRecord(name, cooldown.target, cooldown.until), now))
        try:
            await self._write(ops)
        except StoreError:
            raise StoreUnavailable("the lease store could not record the report") from None
        if effect.cooldown is not None:
            scopes = self.ledger.cooldowns.setdefault(name, {})
            scope = merge_cooldown(scopes, effect.cooldown.target, effect.cooldown.until, now)
            event(
                log,
                logging.INFO,
                "proxy cooling down",
                proxy=name,
                target=scope,
                until=scopes[scope],
            )
        if effect.error is not None:
            self._health.report_error(name, effect.error)
        self._metrics.reports.labels(outcome).inc()

    async def release(self, lease_id: str) -> None:
        now = self._clock()
        lease = self._live(lease_id, now)
        lease.ending = True
        try:
            await self._write((EndLease(lease.id),))
        except StoreError:
            lease.ending = False
            self.ledger.schedule(lease.expires_at, lease.id)
            raise StoreUnavailable("the lease store could not record the release") from None
        self.ledger.end(lease)
        self._metrics.released.inc()
        event(log, logging.DEBUG, "lease released", lease=lease.id, proxy=lease.proxy.name)

    async def cooling(self, lease_id: str, host: str) -> bool:
        now = self._clock()
        lease = self._live(lease_id, now)
        return self.ledger.cooling_until(lease.proxy.name, cooldown_scopes(host), now) is not None

    # -- background work -----------------------------------------------------------------

    async def expire_due(self) -> int:
        """Ends every lease whose time is up, and forgets proxies that left the
        fleet; returns how many leases ended."""
        now = self._clock()
        expired = self.ledger.due(now)
        ended = await self._end_expired(expired, now) if expired else 0
        return ended + await self._departures.forget_when_due(now)

    def next_expiry(self) -> float | None:
        return self.ledger.next_expiry()

    async def maintain(self) -> None:
        now = self._clock()
        await self.prune_cooldowns()
        await self.repair_pool()
        # A failure is logged by the store; the next round prunes more.
        with contextlib.suppress(StoreError):
            await self._write(
                (Prune(now, now - REPORT_RETENTION_S, refusals_before=now - REFUSAL_RETENTION_S),)
            )

    async def _end_expired(self, leases: list[HeldLease], now: float) -> int:
        try:
            await self._write([EndLease(lease.id) for lease in leases])
        except StoreError as exc:
            event(log, logging.WARNING, "lease expiry not recorded; retrying", error=str(exc))
            for lease in leases:
                lease.ending = False
                self.ledger.schedule(max(lease.expires_at, now + RETRY_S), lease.id)
            return 0
        for lease in leases:
            self.ledger.end(lease)
            self._metrics.expired.inc()
            event(log, logging.INFO, "lease expired", lease=lease.id, proxy=lease.proxy.name)
        return len(leases)

    async def repair_pool(self) -> int:
        """Puts right every proxy whose place in the free pool disagrees with
        the engine's view (a guard against a missed health event) and returns
        how many did. A few hundred proxies per turn of the event loop: a
        rebuild of 10,000 in one go held every request up for 25 ms. Each
        proxy is judged and fixed in one step, so grants and releases in
        between stay right; the pool keeps its order."""
        ledger, wrong = self.ledger, 0
        async for name in taking_turns([*ledger.fleet, *ledger.pool]):
            if ledger.free(name) != (name in ledger.pool):
                ledger.sync_proxy(name)
                wrong += 1
        if wrong:
            event(log, logging.WARNING, "free pool repaired", proxies=wrong)
        return wrong

    async def prune_cooldowns(self) -> None:
        """Forgets cooldowns that are over (the store prunes its own copy), a
        few hundred proxies per turn of the event loop: up to 64 per proxy
        of a large fleet is too many to walk in one go."""
        now, cooldowns = self._clock(), self.ledger.cooldowns
        async for name in taking_turns(list(cooldowns)):
            scopes = cooldowns.get(name)
            if scopes is None:
                continue  # the proxy left meanwhile
            live = {t: u for t, u in scopes.items() if u > now}
            if live:
                cooldowns[name] = live
            else:
                del cooldowns[name]

    # -- views ---------------------------------------------------------------------------

    async def proxies_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        now, ledger = self._clock(), self.ledger
        answer = []
        async for name, proxy in taking_turns(list(ledger.fleet.items())):
            state = self._health.health(name)
            lease = ledger.by_proxy.get(name)
            answer.append(
                proxy_json(
                    proxy,
                    health=str(state.health) if state else str(Health.UNKNOWN),
                    latency_ms=state.latency_ms if state else None,
                    last_error=state.last_error if state else None,
                    leased=lease is not None,
                    cooldowns=[
                        (until, target)
                        for target, until in ledger.cooldowns.get(name, {}).items()
                        if until > now
                    ],
                    detail=ProxyDetail(
                        (lease.holder, lease.expires_at) if lease is not None else None,
                        state.recent_ms if state else (),
                    )
                    if detail
                    else None,
                )
            )
        return answer

    async def signals(self, window: float) -> SignalCounts:
        if self._tally is None:
            raise StoreUnavailable("this store keeps no signals")
        try:
            return await self._tally.count(self._clock(), window)
        except StoreError:
            raise StoreUnavailable("the lease store could not be read") from None

    async def refresh_snapshot(self) -> None:
        """Nothing to fetch: snapshot() reads memory."""

    def snapshot(self) -> StateSnapshot:
        return self.ledger.snapshot(self._clock())

    # -- internals -----------------------------------------------------------------------

    def _live(self, lease_id: str, now: float) -> HeldLease:
        lease = self.ledger.live(lease_id, now) if is_lease_id(lease_id) else None
        if lease is None:
            raise LeaseNotFound(lease_id)
        return lease


__all__ = ["RETRY_S", "SqliteBook"]
