"""The lease book: who holds which proxy until when, which proxies cool down
for which targets, and the rules that decide a grant.

All of it lives in memory and changes only on the event loop, synchronously:
the check that a proxy is free and the act of taking it happen without an
`await` in between, which is what makes leases exclusive under any number of
concurrent requests. Each change is queued to the store in that same step
(so the store sees changes in the order they happened) and the caller
answers only after the store has committed it.
"""

from __future__ import annotations

import base64
import heapq
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from discovery.fleet import Fleet, FleetProxy
from discovery.health_source import HealthSource
from discovery.logs import event
from discovery.metrics import Metrics, StateSnapshot
from discovery.selection import FreePool, Selector
from discovery.store import (
    AddReport,
    CooldownRecord,
    EndLease,
    ForgetProxy,
    LeaseRecord,
    LeaseStore,
    Op,
    PutCooldown,
    PutLease,
    ReportRecord,
    StoredState,
    StoreError,
)
from discovery.targets import EVERYWHERE
from health.model import Health

log = logging.getLogger("discovery.leases")

Outcome = Literal["ok", "blocked", "error"]


class LeaseNotFound(Exception):
    """No such lease, or it has ended (released, expired, proxy left the fleet)."""


class StoreUnavailable(Exception):
    """The change could not be made durable, so it was not made."""


class NoProxyAvailable(Exception):
    def __init__(self, reason: str, retry_after: int, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.retry_after = retry_after
        self.detail = detail


@dataclass(slots=True)
class Lease:
    id: str
    proxy: FleetProxy
    holder: str
    target: str | None  # host name the lease was asked for
    ttl: float
    granted_at: float
    expires_at: float

    def record(self) -> LeaseRecord:
        return LeaseRecord(
            self.id,
            self.proxy.name,
            self.holder,
            self.target,
            self.ttl,
            self.granted_at,
            self.expires_at,
        )


@dataclass(frozen=True)
class Candidate:
    """A proxy matching a selector, as a refusal (409) explains itself."""

    name: str
    healthy: bool
    leased_until: float | None
    cooling_until: float | None


@dataclass(frozen=True)
class FleetChange:
    added: list[str]
    removed: list[str]
    changed: list[str]
    revoked: int


class _LeaseIds:
    """Unguessable lease ids (an id is what lets a crawler renew, report and
    release): 16 random bytes each, taken from the OS 4 KiB at a time to save
    a system call per grant."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        if self._at + 16 > len(self._pool):
            self._pool, self._at = os.urandom(4096), 0
        chunk = self._pool[self._at : self._at + 16]
        self._at += 16
        return base64.urlsafe_b64encode(chunk).rstrip(b"=").decode()


def rfc3339(timestamp: float) -> str:
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LeaseBook:
    def __init__(
        self,
        *,
        store: LeaseStore,
        health: HealthSource,
        metrics: Metrics,
        max_ttl: float,
        cooldown: float,
        probe_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._health = health
        self._metrics = metrics
        self.max_ttl = max_ttl
        self.cooldown = cooldown
        self._probe_interval = probe_interval
        self._clock = clock
        self._fleet: dict[str, FleetProxy] = {}
        self._leases: dict[str, Lease] = {}
        self._by_proxy: dict[str, Lease] = {}
        self._cooldowns: dict[str, dict[str, float]] = {}  # proxy -> target -> until
        self._last_used: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []  # heap; entries may be stale
        self._pool = FreePool()
        self._new_id = _LeaseIds()

    # -- startup and fleet ---------------------------------------------------------------

    async def restore(self, state: StoredState, fleet: Fleet) -> None:
        """Takes over the stored state for `fleet`: leases and cooldowns of proxies
        still in it survive; expired leases and those of departed proxies end."""
        now = self._clock()
        self._fleet = dict(fleet.proxies)
        self._last_used = {k: v for k, v in state.last_used.items() if k in self._fleet}
        ops: list[Op] = []
        for record in state.leases:
            proxy = self._fleet.get(record.proxy)
            if proxy is None or record.expires_at <= now:
                ops.append(EndLease(record.id))
                counter = self._metrics.revoked if proxy is None else self._metrics.expired
                counter.inc()
                continue
            self._add(
                Lease(
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
            if cooldown.proxy in self._fleet and cooldown.until > now:
                self._cooldowns.setdefault(cooldown.proxy, {})[cooldown.target] = cooldown.until
        self._health.set_fleet(p.endpoint() for p in self._fleet.values())
        self.resync_pool()
        event(
            log,
            logging.INFO,
            "state restored",
            leases=len(self._leases),
            ended=len(ops),
            cooldowns=sum(len(c) for c in self._cooldowns.values()),
            proxies=len(self._fleet),
        )
        if ops:
            await self._write(ops)

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        """Switches to a new fleet: leases of proxies that stay are kept (with the
        proxy's new address, if it moved); those of departed proxies end."""
        old, new = self._fleet, dict(fleet.proxies)
        removed = [name for name in old if name not in new]
        added = [name for name in new if name not in old]
        changed = [name for name in new if name in old and new[name] != old[name]]
        self._fleet = new
        ops: list[Op] = []
        for name in removed:
            self._pool.discard(name)
            lease = self._by_proxy.get(name)
            if lease is not None:
                self._end(lease)
                ops.append(EndLease(lease.id))
                self._metrics.revoked.inc()
                event(log, logging.INFO, "lease revoked", lease=lease.id, proxy=name)
            self._cooldowns.pop(name, None)
            self._last_used.pop(name, None)
            ops.append(ForgetProxy(name))
        for name in changed:
            lease = self._by_proxy.get(name)
            if lease is not None:
                lease.proxy = new[name]
        self._health.set_fleet(p.endpoint() for p in new.values())
        for name in added:
            if self._healthy(name):
                self._pool.add(name, never_used=name not in self._last_used)
        revoked = sum(1 for op in ops if isinstance(op, EndLease))
        if ops:
            await self._write(ops)
        return FleetChange(added, removed, changed, revoked)

    def on_health_change(self, name: str, health: Health) -> None:
        """HealthListener: keeps the free pool in step with the engine."""
        if name not in self._fleet:
            return
        # The engine logs each change at info already.
        event(log, logging.DEBUG, "proxy health changed", proxy=name, health=str(health))
        self.sync_proxy(name)

    def sync_proxy(self, name: str) -> None:
        """Puts `name` in the free pool or takes it out, per the engine's current view."""
        if name in self._fleet and name not in self._by_proxy and self._healthy(name):
            self._pool.add(name, never_used=name not in self._last_used)
        else:
            self._pool.discard(name)

    def resync_pool(self) -> None:
        """Rebuilds the free pool from the engine's view (a guard against a missed
        health event; also the start-up fill)."""
        self._pool.rebuild(
            [
                (self._last_used.get(name, 0.0), name)
                for name in self._fleet
                if name not in self._by_proxy and self._healthy(name)
            ]
        )

    # -- the API's operations ------------------------------------------------------------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        now = self._clock()
        # Leases past their time free their proxies now, not at the next sweep.
        ops = self._expire(now)
        stale: list[str] = []

        def eligible(name: str) -> bool:
            proxy = self._fleet.get(name)
            if proxy is None or not self._healthy(name):
                stale.append(name)
                return False
            if not selector.empty and not selector.matches(proxy):
                return False
            return self._cooling_until(name, host, now) is None

        name = self._pool.pick(eligible)
        for gone in stale:
            self._pool.discard(gone)
        if name is None:
            denial = self._denial(selector, host, now)
            self._metrics.denied.labels(denial.reason).inc()
            if ops:
                await self._write(ops)
            raise denial
        lifetime = self._ttl(ttl)
        lease = Lease(
            self._new_id(),
            self._fleet[name],
            holder,
            host,
            lifetime,
            now,
            now + lifetime,
        )
        self._add(lease)
        self._last_used[name] = now
        try:
            await self._store.write((*ops, PutLease(lease.record())))
        except StoreError:
            if self._leases.get(lease.id) is lease:
                self._end(lease)
            raise StoreUnavailable("the lease store could not record the grant") from None
        self._metrics.granted.inc()
        event(log, logging.DEBUG, "lease granted", lease=lease.id, proxy=name, holder=holder)
        return lease

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        now = self._clock()
        lease = self._live(lease_id, now)
        before = (lease.ttl, lease.expires_at)
        lease.ttl = self._ttl(ttl if ttl is not None else lease.ttl)
        lease.expires_at = now + lease.ttl
        heapq.heappush(self._expiry, (lease.expires_at, lease.id))
        try:
            await self._store.write((PutLease(lease.record()),))
        except StoreError:
            if self._leases.get(lease.id) is lease:
                lease.ttl, lease.expires_at = before
            raise StoreUnavailable("the lease store could not record the renewal") from None
        event(log, logging.DEBUG, "lease renewed", lease=lease.id, proxy=lease.proxy.name)
        return lease

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        now = self._clock()
        lease = self._live(lease_id, now)
        name = lease.proxy.name
        ops: list[Op] = [AddReport(ReportRecord(now, lease.id, name, lease.holder, outcome, host))]
        if outcome == "blocked" and self.cooldown > 0:
            scope = host or EVERYWHERE
            scopes = self._cooldowns.setdefault(name, {})
            until = max(scopes.get(scope, 0.0), now + self.cooldown)
            scopes[scope] = until
            ops.append(PutCooldown(CooldownRecord(name, scope, until)))
            event(log, logging.INFO, "proxy cooling down", proxy=name, target=scope, until=until)
        elif outcome == "error":
            where = f" for {host}" if host else ""
            self._health.report_error(name, f"a crawler reported an error{where}")
        self._metrics.reports.labels(outcome).inc()
        await self._write(ops, required=True)

    async def release(self, lease_id: str) -> None:
        lease = self._live(lease_id, self._clock())
        self._end(lease)
        self._metrics.released.inc()
        event(log, logging.DEBUG, "lease released", lease=lease.id, proxy=lease.proxy.name)
        await self._write((EndLease(lease.id),), required=True)

    async def expire_due(self) -> int:
        """Ends every lease whose time is up; returns how many."""
        ops = self._expire(self._clock())
        if ops:
            await self._write(ops)
        return len(ops)

    def _expire(self, now: float) -> list[Op]:
        ops: list[Op] = []
        while self._expiry and self._expiry[0][0] <= now:
            _, lease_id = heapq.heappop(self._expiry)
            lease = self._leases.get(lease_id)
            if lease is None or lease.expires_at > now:
                continue  # released, or renewed (a later entry stands for it)
            self._end(lease)
            ops.append(EndLease(lease.id))
            self._metrics.expired.inc()
            event(log, logging.INFO, "lease expired", lease=lease.id, proxy=lease.proxy.name)
        return ops

    def next_expiry(self) -> float | None:
        return self._expiry[0][0] if self._expiry else None

    # -- views ---------------------------------------------------------------------------

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        return lease_json(lease)

    async def proxies_json(self) -> list[dict[str, Any]]:
        now = self._clock()
        answer = []
        for name, proxy in self._fleet.items():
            state = self._health.health(name)
            answer.append(
                proxy_json(
                    proxy,
                    health=str(state.health) if state else str(Health.UNKNOWN),
                    latency_ms=state.latency_ms if state else None,
                    last_error=state.last_error if state else None,
                    leased=name in self._by_proxy,
                    cooldowns=[
                        (until, target)
                        for target, until in self._cooldowns.get(name, {}).items()
                        if until > now
                    ],
                )
            )
        return answer

    def snapshot(self) -> StateSnapshot:
        now = self._clock()
        by_health = {str(h): 0 for h in Health}
        for name in self._fleet:
            state = self._health.health(name)
            by_health[str(state.health) if state else str(Health.UNKNOWN)] += 1
        cooling = sum(
            1 for scopes in self._cooldowns.values() for until in scopes.values() if until > now
        )
        return StateSnapshot(len(self._leases), cooling, by_health)

    def prune_cooldowns(self) -> None:
        """Forgets cooldowns that are over (the store prunes its own copy)."""
        now = self._clock()
        for name in list(self._cooldowns):
            scopes = {t: u for t, u in self._cooldowns[name].items() if u > now}
            if scopes:
                self._cooldowns[name] = scopes
            else:
                del self._cooldowns[name]

    # -- internals -----------------------------------------------------------------------

    def _healthy(self, name: str) -> bool:
        state = self._health.health(name)
        return state is not None and state.health == Health.HEALTHY

    def _ttl(self, requested: float | None) -> float:
        return self.max_ttl if requested is None else min(requested, self.max_ttl)

    def _live(self, lease_id: str, now: float) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None or lease.expires_at <= now:
            raise LeaseNotFound(lease_id)
        return lease

    def _add(self, lease: Lease) -> None:
        self._leases[lease.id] = lease
        self._by_proxy[lease.proxy.name] = lease
        self._pool.discard(lease.proxy.name)
        heapq.heappush(self._expiry, (lease.expires_at, lease.id))

    def _end(self, lease: Lease) -> None:
        name = lease.proxy.name
        del self._leases[lease.id]
        if self._by_proxy.get(name) is lease:
            del self._by_proxy[name]
        if name in self._fleet and self._healthy(name):
            self._pool.add(name)

    def _cooling_until(self, name: str, host: str | None, now: float) -> float | None:
        """When the cooldown that keeps `name` from `host` ends (None: it does not)."""
        scopes = self._cooldowns.get(name)
        if not scopes:
            return None
        until = scopes.get(EVERYWHERE, 0.0)
        if host is not None:
            until = max(until, scopes.get(host, 0.0))
        return until if until > now else None

    def _denial(self, selector: Selector, host: str | None, now: float) -> NoProxyAvailable:
        candidates = []
        for name, proxy in self._fleet.items():
            if not selector.matches(proxy):
                continue
            lease = self._by_proxy.get(name)
            candidates.append(
                Candidate(
                    name,
                    self._healthy(name),
                    lease.expires_at if lease is not None else None,
                    self._cooling_until(name, host, now),
                )
            )
        return refusal(candidates, host, now, self._probe_interval)

    async def _write(self, ops: Sequence[Op], *, required: bool = False) -> None:
        try:
            await self._store.write(ops)
        except StoreError as exc:
            event(log, logging.ERROR, "store write failed", error=str(exc))
            if required:
                raise StoreUnavailable("the lease store could not record the change") from None


def lease_json(lease: Lease) -> dict[str, Any]:
    return {
        "id": lease.id,
        "holder": lease.holder,
        "proxy": {"name": lease.proxy.name, "url": lease.proxy.url},
        "expiresAt": rfc3339(lease.expires_at),
    }


def proxy_json(
    proxy: FleetProxy,
    *,
    health: str,
    latency_ms: float | None,
    last_error: str | None,
    leased: bool,
    cooldowns: list[tuple[float, str]],
) -> dict[str, Any]:
    """One proxy in `GET /v1/proxies`: never its credentials."""
    if last_error and proxy.password:
        # The engine should never put a password in an error; make sure.
        last_error = last_error.replace(proxy.password, "[redacted]")
    return {
        "name": proxy.name,
        "provider": proxy.provider,
        "type": proxy.type,
        "zone": proxy.zone,
        "labels": dict(proxy.labels),
        "health": health,
        "latencyMs": round(latency_ms, 3) if latency_ms is not None else None,
        "lastError": last_error,
        "leased": leased,
        "cooldowns": [{"target": t, "until": rfc3339(u)} for u, t in sorted(cooldowns)],
    }


def refusal(
    candidates: Sequence[Candidate], host: str | None, now: float, probe_interval: float
) -> NoProxyAvailable:
    """Why no proxy among those matching the selector can be leased now, and
    when the first of them may be (Retry-After)."""
    leased = cooling = unhealthy = free_but_cooling = 0
    soonest = math.inf
    for candidate in candidates:
        free_at = now
        if candidate.leased_until is not None:
            leased += 1
            free_at = max(free_at, candidate.leased_until)
        if candidate.cooling_until is not None:
            cooling += 1
            free_at = max(free_at, candidate.cooling_until)
        if not candidate.healthy:
            unhealthy += 1
            # Unknown until probed again; the next probe is the earliest chance.
            free_at = max(free_at, now + probe_interval)
        elif candidate.leased_until is None:
            free_but_cooling += 1
        soonest = min(soonest, free_at)
    matching = len(candidates)
    if matching == 0:
        return NoProxyAvailable(
            "no_match",
            max(1, math.ceil(probe_interval)),
            "no proxy of the fleet matches the selector",
        )
    if free_but_cooling:
        reason = "cooldown"
    elif unhealthy < matching:
        reason = "leased"
    else:
        reason = "unhealthy"
    scope = f" for {host}" if host else ""
    detail = (
        f"{matching} matching {'proxy' if matching == 1 else 'proxies'}: {leased} leased, "
        f"{cooling} cooling down{scope}, {unhealthy} not healthy"
    )
    return NoProxyAvailable(reason, max(1, math.ceil(soonest - now)), detail)


__all__ = [
    "Candidate",
    "FleetChange",
    "Lease",
    "LeaseBook",
    "LeaseNotFound",
    "NoProxyAvailable",
    "StoreUnavailable",
    "lease_json",
    "proxy_json",
    "refusal",
    "rfc3339",
]
