"""The lease book: who holds which proxy until when, which proxies cool down
for which targets, and the rules that decide a grant.

All of it lives in memory and changes only on the event loop, synchronously:
the check that a proxy is free and the act of taking it happen without an
`await` in between, which is what makes leases exclusive under any number of
concurrent requests. Each change is queued to the store in that same step
(so the store sees changes in the order they happened) and the caller
answers only after the store has committed it.

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

import asyncio
import base64
import heapq
import logging
import math
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

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
    merge_cooldown,
)
from discovery.targets import EVERYWHERE
from health.model import Health

log = logging.getLogger("discovery.leases")

Outcome = Literal["ok", "blocked", "error"]

# How long an expiry or a revocation the store could not record waits before
# it is tried again.
RETRY_S = 1.0
# The expiry heap's stale entries are dropped when it outgrows twice its
# size after the last drop plus this (LeaseBook._schedule).
EXPIRY_SLACK = 1024


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
    # Writes in flight (the SQLite book; see the module's docstring):
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
        self._compact_at = EXPIRY_SLACK  # heap size at which stale entries are dropped
        self._pool = FreePool()
        self._new_id = _LeaseIds()
        # Proxies that left the fleet and are not yet forgotten by the store
        # (their lease ended, cooldowns and usage dropped), with the ids of
        # stored leases on them that memory never held (found at restore).
        self._departed: dict[str, list[str]] = {}
        self._forgetting: set[str] = set()  # of those, the ones being written now
        self._forget_at = 0.0  # when to try again after a failed write

    # -- startup and fleet ---------------------------------------------------------------

    async def restore(self, state: StoredState, fleet: Fleet) -> None:
        """Takes over the stored state for `fleet`: leases and cooldowns of proxies
        still in it survive; expired leases and those of departed proxies end."""
        now = self._clock()
        self._fleet = dict(fleet.proxies)
        self._last_used = {k: v for k, v in state.last_used.items() if k in self._fleet}
        known = {c.proxy for c in state.cooldowns} | set(state.last_used)
        for name in known - set(self._fleet):
            self._departed.setdefault(name, [])
        expired = 0
        for record in state.leases:
            proxy = self._fleet.get(record.proxy)
            if proxy is None:
                self._departed.setdefault(record.proxy, []).append(record.id)
                continue
            # Expired ones too: the first sweep (below) ends them, or retries.
            expired += record.expires_at <= now
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
            leases=len(self._leases) - expired,
            expired=expired,
            departed=len(self._departed),
            cooldowns=sum(len(c) for c in self._cooldowns.values()),
            proxies=len(self._fleet),
        )
        await self.expire_due()

    async def apply_fleet(self, fleet: Fleet) -> FleetChange:
        """Switches to a new fleet: leases of proxies that stay are kept (with the
        proxy's new address, if it moved); those of departed proxies end (404
        at once; in the store as soon as it can record it)."""
        old, new = self._fleet, dict(fleet.proxies)
        removed = [name for name in old if name not in new]
        added = [name for name in new if name not in old]
        changed = [name for name in new if name in old and new[name] != old[name]]
        self._fleet = new
        for name in removed:
            self._pool.discard(name)
            self._departed.setdefault(name, [])
        for name in added:
            # Back before the store forgot it, and the store holds nothing of it
            # that memory does not: nothing to forget. (Otherwise it stays out of
            # the pool until the forget is committed.)
            if name not in self._forgetting and not self._departed.get(name):
                self._departed.pop(name, None)
        for name in changed:
            lease = self._by_proxy.get(name)
            if lease is not None:
                lease.proxy = new[name]
        self._health.set_fleet(p.endpoint() for p in new.values())
        for name in added:
            self.sync_proxy(name)
        revoked = await self._forget_departed(self._clock())
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
        if self._free(name):
            self._pool.add(name, never_used=name not in self._last_used)
        else:
            self._pool.discard(name)

    def resync_pool(self) -> None:
        """Rebuilds the free pool from the engine's view, least recently used
        first (the start-up fill; the whole fleet in one go)."""
        self._pool.rebuild(
            [(self._last_used.get(name, 0.0), name) for name in self._fleet if self._free(name)]
        )

    async def repair_pool(self) -> int:
        """Puts right every proxy whose place in the free pool disagrees with
        the engine's view (a guard against a missed health event) and returns
        how many did. A few hundred proxies per turn of the event loop: a
        rebuild of 10,000 in one go held every request up for 25 ms. Each
        proxy is judged and fixed in one step, so grants and releases in
        between stay right; the pool keeps its order."""
        wrong = 0
        async for name in taking_turns([*self._fleet, *self._pool]):
            if self._free(name) != (name in self._pool):
                self.sync_proxy(name)
                wrong += 1
        if wrong:
            event(log, logging.WARNING, "free pool repaired", proxies=wrong)
        return wrong

    # -- the API's operations ------------------------------------------------------------

    async def grant(
        self, holder: str, *, ttl: float | None, selector: Selector, host: str | None
    ) -> Lease:
        now = self._clock()
        # Leases past their time free their proxies now, not at the next sweep
        # (once their end is committed: a failure leaves them to the sweep).
        expired = self._expire(now)
        if expired:
            await self._end_expired(expired, now)
            now = self._clock()
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
            committed=False,
        )
        self._add(lease)  # reserved: no other grant takes the proxy from here on
        try:
            await self._store.write((PutLease(lease.record()),))
        except StoreError:
            # Its proxy is free again, first in line as it was (its last use is
            # unchanged; the pool's next rebuild orders it exactly).
            self._end(lease, front=True)
            raise StoreUnavailable("the lease store could not record the grant") from None
        lease.committed = True
        self._last_used[name] = now
        self._schedule(lease.expires_at, lease.id)
        self._metrics.grant()
        event(log, logging.DEBUG, "lease granted", lease=lease.id, proxy=name, holder=holder)
        return lease

    async def renew(self, lease_id: str, *, ttl: float | None) -> Lease:
        now = self._clock()
        lease = self._live(lease_id, now)
        lifetime = self._ttl(ttl if ttl is not None else lease.ttl)
        expires_at = now + lifetime
        lease.renewals += 1  # the sweep leaves it alone until this is decided
        try:
            await self._store.write((PutLease(lease.record(lifetime, expires_at)),))
        except StoreError:
            raise StoreUnavailable("the lease store could not record the renewal") from None
        else:
            lease.ttl, lease.expires_at = lifetime, expires_at
        finally:
            lease.renewals -= 1
            self._schedule(lease.expires_at, lease.id)
        event(log, logging.DEBUG, "lease renewed", lease=lease.id, proxy=lease.proxy.name)
        return lease

    async def report(self, lease_id: str, outcome: Outcome, *, host: str | None) -> None:
        now = self._clock()
        lease = self._live(lease_id, now)
        name = lease.proxy.name
        ops: list[Op] = [AddReport(ReportRecord(now, lease.id, name, lease.holder, outcome, host))]
        cooldown = None
        if outcome == "blocked" and self.cooldown > 0:
            cooldown = PutCooldown(
                CooldownRecord(name, host or EVERYWHERE, now + self.cooldown), now
            )
            ops.append(cooldown)
        try:
            await self._store.write(ops)
        except StoreError:
            raise StoreUnavailable("the lease store could not record the report") from None
        if cooldown is not None:
            record = cooldown.cooldown
            scope = merge_cooldown(
                self._cooldowns.setdefault(name, {}), record.target, record.until, now
            )
            until = self._cooldowns[name][scope]
            event(log, logging.INFO, "proxy cooling down", proxy=name, target=scope, until=until)
        elif outcome == "error":
            where = f" for {host}" if host else ""
            self._health.report_error(name, f"a crawler reported an error{where}")
        self._metrics.reports.labels(outcome).inc()

    async def release(self, lease_id: str) -> None:
        now = self._clock()
        lease = self._live(lease_id, now)
        lease.ending = True
        try:
            await self._store.write((EndLease(lease.id),))
        except StoreError:
            lease.ending = False
            self._schedule(lease.expires_at, lease.id)
            raise StoreUnavailable("the lease store could not record the release") from None
        self._end(lease)
        self._metrics.released.inc()
        event(log, logging.DEBUG, "lease released", lease=lease.id, proxy=lease.proxy.name)

    async def expire_due(self) -> int:
        """Ends every lease whose time is up, and forgets proxies that left the
        fleet; returns how many leases ended."""
        now = self._clock()
        expired = self._expire(now)
        ended = await self._end_expired(expired, now) if expired else 0
        if self._departed and now >= self._forget_at:
            ended += await self._forget_departed(now)
        return ended

    def _expire(self, now: float) -> list[Lease]:
        """Marks the leases due at `now` ending, for one write (_end_expired)."""
        due: list[Lease] = []
        while self._expiry and self._expiry[0][0] <= now:
            _, lease_id = heapq.heappop(self._expiry)
            lease = self._leases.get(lease_id)
            if lease is None or lease.expires_at > now:
                continue  # released, or renewed (a later entry stands for it)
            if lease.ending or lease.renewals or not lease.committed:
                continue  # a write in flight decides; it puts the lease back in the heap
            lease.ending = True
            due.append(lease)
        return due

    async def _end_expired(self, leases: list[Lease], now: float) -> int:
        try:
            await self._store.write([EndLease(lease.id) for lease in leases])
        except StoreError as exc:
            event(log, logging.WARNING, "lease expiry not recorded; retrying", error=str(exc))
            for lease in leases:
                lease.ending = False
                self._schedule(max(lease.expires_at, now + RETRY_S), lease.id)
            return 0
        for lease in leases:
            self._end(lease)
            self._metrics.expired.inc()
            event(log, logging.INFO, "lease expired", lease=lease.id, proxy=lease.proxy.name)
        return len(leases)

    async def _forget_departed(self, now: float) -> int:
        """Ends the leases of proxies that left the fleet and drops their
        cooldowns and usage, in one write; returns how many leases ended."""
        names = []
        for name in list(self._departed):
            if name in self._forgetting:
                continue
            if name in self._fleet and not self._departed[name]:
                del self._departed[name]  # back in the fleet: nothing left to forget
                self.sync_proxy(name)
                continue
            names.append(name)
        if not names:
            return 0
        ops: list[Op] = []
        ending: list[tuple[str, list[str], Lease | None, bool]] = []
        for name in names:
            orphans = self._departed[name]
            lease = self._by_proxy.get(name)
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
            await self._store.write(ops)
        except StoreError as exc:
            event(log, logging.WARNING, "lease revocation not recorded; retrying", error=str(exc))
            self._forget_at = self._clock() + RETRY_S
            for _, _, lease, marked in ending:
                if lease is not None and marked:
                    lease.ending = False
                    self._schedule(lease.expires_at, lease.id)
            return 0
        finally:
            self._forgetting.difference_update(names)
        revoked = 0
        for name, orphans, lease, _ in ending:
            ids = [*orphans, *([lease.id] if lease is not None else [])]
            if lease is not None:
                self._end(lease)
            for lease_id in ids:
                self._metrics.revoked.inc()
                event(log, logging.INFO, "lease revoked", lease=lease_id, proxy=name)
            revoked += len(ids)
            self._cooldowns.pop(name, None)
            self._last_used.pop(name, None)
            del self._departed[name]
            self.sync_proxy(name)  # back in the fleet meanwhile: free now
        return revoked

    def next_expiry(self) -> float | None:
        return self._expiry[0][0] if self._expiry else None

    # -- views ---------------------------------------------------------------------------

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        return lease_json(lease)

    async def proxies_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """The fleet as `GET /v1/proxies` shows it; `detail` adds each lease's
        holder and end and the recent probe times (the status page)."""
        now = self._clock()
        answer = []
        async for name, proxy in taking_turns(list(self._fleet.items())):
            state = self._health.health(name)
            lease = self._by_proxy.get(name)
            answer.append(
                proxy_json(
                    proxy,
                    health=str(state.health) if state else str(Health.UNKNOWN),
                    latency_ms=state.latency_ms if state else None,
                    last_error=state.last_error if state else None,
                    leased=lease is not None,
                    cooldowns=[
                        (until, target)
                        for target, until in self._cooldowns.get(name, {}).items()
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

    def snapshot(self) -> StateSnapshot:
        now = self._clock()
        verdict = self._health.verdict
        counts = Counter(verdict(name) or Health.UNKNOWN for name in self._fleet)
        by_health = {str(h): counts[h] for h in Health}
        cooling = sum(
            1 for scopes in self._cooldowns.values() for until in scopes.values() if until > now
        )
        return StateSnapshot(len(self._leases), cooling, by_health)

    async def prune_cooldowns(self) -> None:
        """Forgets cooldowns that are over (the store prunes its own copy), a
        few hundred proxies per turn of the event loop: up to 64 per proxy
        of a large fleet is too many to walk in one go."""
        now = self._clock()
        async for name in taking_turns(list(self._cooldowns)):
            scopes = self._cooldowns.get(name)
            if scopes is None:
                continue  # the proxy left meanwhile
            live = {t: u for t, u in scopes.items() if u > now}
            if live:
                self._cooldowns[name] = live
            else:
                del self._cooldowns[name]

    # -- internals -----------------------------------------------------------------------

    def _healthy(self, name: str) -> bool:
        return self._health.verdict(name) == Health.HEALTHY

    def _ttl(self, requested: float | None) -> float:
        return self.max_ttl if requested is None else min(requested, self.max_ttl)

    def _live(self, lease_id: str, now: float) -> Lease:
        """The lease, if a crawler may still use it: committed, not past its
        time, not ending, its proxy still in the fleet."""
        lease = self._leases.get(lease_id)
        if (
            lease is None
            or lease.expires_at <= now
            or lease.ending
            or not lease.committed
            or lease.proxy.name not in self._fleet
            or lease.proxy.name in self._departed
        ):
            raise LeaseNotFound(lease_id)
        return lease

    def _free(self, name: str) -> bool:
        return (
            name in self._fleet
            and name not in self._by_proxy
            and name not in self._departed
            and self._healthy(name)
        )

    def _add(self, lease: Lease) -> None:
        self._leases[lease.id] = lease
        self._by_proxy[lease.proxy.name] = lease
        self._pool.discard(lease.proxy.name)
        self._schedule(lease.expires_at, lease.id)

    def _end(self, lease: Lease, *, front: bool = False) -> None:
        """Drops `lease` (if still held) and frees its proxy: at the back of
        the pool, unless never used or `front`."""
        if self._leases.get(lease.id) is not lease:
            return
        del self._leases[lease.id]
        name = lease.proxy.name
        if self._by_proxy.get(name) is lease:
            del self._by_proxy[name]
            if self._free(name):
                self._pool.add(name, never_used=front or name not in self._last_used)

    def _schedule(self, at: float, lease_id: str) -> None:
        """Lets the sweep look at `lease_id` at `at`. Entries of leases that
        ended meanwhile are skipped when due, but until then each is an
        object in memory and in the garbage collector's young generation
        (a lease's time is minutes, a grant+release pair milliseconds: a
        few hundred thousand of them at a steady 1,000 pairs/s). So they are
        dropped once the heap has grown to twice what it held after the last
        drop: O(1) per entry, amortized."""
        heapq.heappush(self._expiry, (at, lease_id))
        if len(self._expiry) > self._compact_at:
            leases = self._leases
            self._expiry = [entry for entry in self._expiry if entry[1] in leases]
            heapq.heapify(self._expiry)
            self._compact_at = 2 * len(self._expiry) + EXPIRY_SLACK

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


T = TypeVar("T")
TURN = 256  # proxies built per turn of the event loop (taking_turns)


async def taking_turns(items: Iterable[T], every: int = TURN) -> AsyncIterator[T]:
    """`items`, letting the event loop serve others every `every` of them: the
    whole fleet as JSON (10,000 proxies: about 100 ms) must not hold every
    grant and release up for that long. Callers iterate over a copy, so a
    fleet reloaded meanwhile does not change what they walk."""
    for index, item in enumerate(items):
        if index and index % every == 0:
            await asyncio.sleep(0)
        yield item


def lease_json(lease: Lease) -> dict[str, Any]:
    return {
        "id": lease.id,
        "holder": lease.holder,
        "proxy": {"name": lease.proxy.name, "url": lease.proxy.url},
        "expiresAt": rfc3339(lease.expires_at),
    }


@dataclass(frozen=True)
class ProxyDetail:
    """What the status page shows beyond `GET /v1/proxies`."""

    lease: tuple[str, float] | None  # (holder, expires at)
    recent_ms: Sequence[float | None]  # the latest probes' times, oldest first


def proxy_json(
    proxy: FleetProxy,
    *,
    health: str,
    latency_ms: float | None,
    last_error: str | None,
    leased: bool,
    cooldowns: list[tuple[float, str]],
    detail: ProxyDetail | None = None,
) -> dict[str, Any]:
    """One proxy in `GET /v1/proxies` (with `detail`: on the status page):
    never its credentials."""
    if last_error and proxy.password:
        # The engine should never put a password in an error; make sure.
        last_error = last_error.replace(proxy.password, "[redacted]")
    answer: dict[str, Any] = {
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
    if detail is not None:
        answer["lease"] = (
            {"holder": detail.lease[0], "expiresAt": rfc3339(detail.lease[1])}
            if detail.lease is not None
            else None
        )
        answer["recentMs"] = list(detail.recent_ms)
    return answer


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
    "ProxyDetail",
    "StoreUnavailable",
    "lease_json",
    "proxy_json",
    "refusal",
    "rfc3339",
]
