"""The leases the gateway holds for its clients, taken from the lease book in
the same process (no HTTP call per request), under the same rules as any
other holder's.

- A **session** (`HOLDER-session-ID`) holds one lease: every request and
  tunnel of the session leaves through its proxy. It moves to another proxy
  only when its proxy is banned by a site, fails, or cools down for the site
  asked for (a proxy cooling down for a site is never used for it).
- Without a session, requests for one site share a **site set** of up to
  `per_site` leases granted for that site (a free one first, then a new
  lease, then the least busy one), as the crawler client's pool does.

A hold is in use while a request or tunnel runs through it. Held leases are
renewed while in use or recently used, and released once idle for
`idle_release` seconds. A holder may hold at most `holder_leases` leases.

The fleet (`fleet_changed`, called by the service before its book switches):
no new request or tunnel goes to a proxy the fleet no longer has. Its holds
leave their session or site set at once (the next request gets another
proxy; a tunnel already open through it may finish: the proxy is never
granted to anyone again), a lease the book granted on it meanwhile is not
used, and a proxy whose address or credentials changed is used at its new
ones.

Everything runs on the event loop; `clock` is wall-clock seconds, as the
book's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from discovery.book.contract import Lease, LeaseBook, Outcome
from discovery.book.errors import LeaseNotFound, NoProxyAvailable, StoreUnavailable
from discovery.fleet import FleetProxy
from discovery.gateway.identity import Identity
from discovery.logs import event

log = logging.getLogger("discovery.gateway")

# ("set", holder, selector, site) or ("session", holder, session, selector)
Key = tuple[object, ...]
GROW_RETRY_S = 1.0


class HolderLimit(Exception):
    """The holder holds as many leases as it may."""


@dataclass(eq=False)
class Hold:
    lease: Lease
    identity: Identity
    key: Key
    last_used: float
    in_use: int = 0
    clear_sites: set[str] = field(default_factory=set)  # not cooling down for these (sessions)
    closers: set[Callable[[], None]] = field(default_factory=set)  # open tunnels
    dropped: bool = False  # out of its session or site set: no new work
    released: bool = False

    @property
    def proxy(self) -> str:
        return self.lease.proxy.name


class Holds:
    def __init__(
        self,
        book: Callable[[], LeaseBook],
        *,
        per_site: int = 4,
        idle_release: float = 60.0,
        holder_leases: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._book = book
        self.per_site = per_site
        self.idle_release = idle_release
        self.holder_leases = holder_leases
        self._clock = clock
        self.sessions: dict[Key, Hold] = {}
        self.sets: dict[Key, list[Hold]] = {}
        self._per_holder: dict[str, int] = {}
        self._granting: dict[Key, asyncio.Task[Hold]] = {}
        self._grow_at: dict[Key, float] = {}  # a full set asks the book again from then
        self._moved: set[Hold] = set()  # out of use for new work, still busy
        self._releasing: set[asyncio.Task[None]] = set()
        # The fleet as the service last read it; None until it changes once
        # (until then the book's fleet is the one the service started with).
        self._fleet: Mapping[str, FleetProxy] | None = None

    # -- taking a proxy ------------------------------------------------------------------

    async def acquire(self, identity: Identity, site: str) -> Hold:
        """A hold to send one request or tunnel for `site` through; `done()` it
        after. Raises NoProxyAvailable, HolderLimit or StoreUnavailable."""
        hold = await (
            self._session(identity, site) if identity.session else self._site(identity, site)
        )
        hold.in_use += 1
        hold.last_used = self._clock()
        return hold

    def done(self, hold: Hold) -> None:
        hold.in_use -= 1
        hold.last_used = self._clock()
        if hold.dropped and hold.in_use == 0:
            self._moved.discard(hold)
            self._release_soon(hold)

    def _release_soon(self, hold: Hold) -> None:
        task = asyncio.get_running_loop().create_task(self._release(hold))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _session(self, identity: Identity, site: str) -> Hold:
        assert identity.session is not None
        key: Key = ("session", identity.holder, identity.session, identity.selector_key)
        hold = self.sessions.get(key)
        if hold is not None and site not in hold.clear_sites:
            if await self._cooling(hold, site):
                await self.move(hold)  # never used for a site it cools down for
                hold = None
            else:
                hold.clear_sites.add(site)
        if hold is None:
            hold = await self._once(key, lambda: self._grant(identity, key, site))
        return hold

    async def _site(self, identity: Identity, site: str) -> Hold:
        key: Key = ("set", identity.holder, identity.selector_key, site)
        holds = self.sets.get(key, [])
        free = [h for h in holds if h.in_use == 0]
        if free:
            return min(free, key=lambda h: h.last_used)
        if len(holds) < self.per_site and (
            not holds or self._clock() >= self._grow_at.get(key, 0.0)
        ):
            try:
                hold = await self._once(key, lambda: self._grant(identity, key, site))
            except (NoProxyAvailable, HolderLimit) as refused:
                holds = self.sets.get(key, [])
                if not holds:
                    raise
                # The set shares what it has; the book is asked again for more
                # only after a while, not on every busy request.
                refused.__traceback__ = None
                self._grow_at[key] = self._clock() + GROW_RETRY_S
            else:
                return hold
        return min(holds, key=lambda h: h.in_use)

    async def _once(self, key: Key, grant: Callable[[], Coroutine[Any, Any, Hold]]) -> Hold:
        """One grant per key at a time; concurrent askers share its outcome. The
        grant runs as a task of its own and registers its hold itself, so a client
        that goes away meanwhile leaves a hold the upkeep releases, not a lease
        nobody knows of."""
        pending = self._granting.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(grant())
            self._granting[key] = pending

            def finished(task: asyncio.Task[Hold]) -> None:
                if self._granting.get(key) is task:
                    del self._granting[key]
                if not task.cancelled():
                    task.exception()  # retrieved: every asker may be gone

            pending.add_done_callback(finished)
        return await asyncio.shield(pending)

    async def _grant(self, identity: Identity, key: Key, site: str) -> Hold:
        held = self._per_holder.get(identity.holder, 0)
        if held >= self.holder_leases:
            raise HolderLimit(f"{identity.holder} holds {held} leases, the most a holder may")
        lease = await self._granted(identity, site)
        self._per_holder[identity.holder] = self._per_holder.get(identity.holder, 0) + 1
        hold = Hold(lease, identity, key, self._clock(), clear_sites={site})
        if key[0] == "session":
            self.sessions[key] = hold
        else:
            self.sets.setdefault(key, []).append(hold)
        event(log, logging.DEBUG, "gateway lease", proxy=hold.proxy, holder=identity.describe())
        return hold

    async def _granted(self, identity: Identity, site: str) -> Lease:
        """A lease from the book on a proxy of the gateway's fleet. The book may
        still grant a proxy the service has just seen leave (its switch is
        under way): such a lease is held aside, so that the book grants
        another, and given back once one is had."""
        aside: list[Lease] = []
        try:
            while True:
                granted = await self._book().grant(
                    identity.describe(), ttl=None, selector=identity.selector, host=site
                )
                lease = self._current(granted)
                if lease is not None:
                    return lease
                aside.append(granted)
        finally:
            for lease in aside:
                with contextlib.suppress(LeaseNotFound, StoreUnavailable):
                    await self._book().release(lease.id)

    def _current(self, lease: Lease) -> Lease | None:
        """`lease` with its proxy as the gateway's fleet has it; None when the
        proxy left it."""
        if self._fleet is None:
            return lease
        proxy = self._fleet.get(lease.proxy.name)
        if proxy is None:
            return None
        return lease if proxy == lease.proxy else replace(lease, proxy=proxy)

    async def _cooling(self, hold: Hold, site: str) -> bool:
        try:
            return await self._book().cooling(hold.lease.id, site)
        except LeaseNotFound:
            self._forget(hold)
            return True

    # -- bans, failures, reports ---------------------------------------------------------

    async def report(self, hold: Hold, outcome: Outcome, site: str | None) -> None:
        """Reports on the hold's lease; `blocked` or `error` also take the hold
        out of use for its session or site (its lease ends once unused)."""
        with contextlib.suppress(LeaseNotFound, StoreUnavailable):
            await self._book().report(hold.lease.id, outcome, host=site)
        if outcome != "ok":
            await self.move(hold)

    async def move(self, hold: Hold) -> None:
        """Takes `hold` out of its session or site set, so that the next request
        gets another proxy; its lease is released once nothing uses it."""
        if hold.dropped:
            return
        self._detach(hold)
        if hold.in_use == 0:
            await self._release(hold)
        else:
            self._moved.add(hold)  # done() releases it

    def fleet_changed(self, proxies: Mapping[str, FleetProxy]) -> list[Hold]:
        """The service read a new fleet (by name): the holds of proxies it lacks
        leave their session or site set now, their leases given back once
        unused (their open tunnels may finish); those of proxies that moved
        use the new address from the next request. Returns the holds moved.
        Synchronous: nothing is sent between this and the next request's
        choice of a proxy."""
        self._fleet = proxies
        left = []
        for hold in self.every():
            current = self._current(hold.lease)
            if current is None:
                left.append(hold)
                self._detach(hold)
                if hold.in_use == 0:
                    self._release_soon(hold)
                else:
                    self._moved.add(hold)  # done() releases it
            else:
                hold.lease = current
        return left

    def session(self, holder: str, session: str) -> list[Hold]:
        return [h for key, h in self.sessions.items() if key[1:3] == (holder, session)]

    # -- upkeep --------------------------------------------------------------------------

    def every(self) -> list[Hold]:
        """The holds of every session and site set."""
        return [*self.sessions.values(), *(h for holds in self.sets.values() for h in holds)]

    async def tick(self) -> None:
        """Renews the leases in use or recently used and releases the idle ones."""
        now = self._clock()
        for hold in self.every():
            if hold.in_use == 0 and now - hold.last_used >= self.idle_release:
                await self.move(hold)
                continue
            lease = hold.lease
            if lease.expires_at - now < lease.ttl / 2:
                try:
                    renewed = self._current(await self._book().renew(lease.id, ttl=None))
                except LeaseNotFound:
                    self._forget(hold)
                except StoreUnavailable:
                    pass  # tried again at the next tick
                else:
                    if renewed is not None and not hold.dropped:
                        hold.lease = renewed
        for key in [k for k, v in self.sets.items() if not v]:
            del self.sets[key]
        for key in [k for k, at in self._grow_at.items() if at <= now or k not in self.sets]:
            del self._grow_at[key]

    async def _release(self, hold: Hold) -> None:
        if hold.released:
            return
        hold.released = True
        self._count_down(hold)
        with contextlib.suppress(LeaseNotFound, StoreUnavailable):
            await self._book().release(hold.lease.id)

    def _forget(self, hold: Hold) -> None:
        """The lease ended without the gateway knowing why (it expired while the
        store failed, or another replica saw its proxy leave first): its
        tunnels close, as the proxy may be granted to someone else."""
        self._detach(hold)
        if not hold.released:
            hold.released = True
            self._count_down(hold)
        for close in list(hold.closers):
            close()

    def _detach(self, hold: Hold) -> None:
        hold.dropped = True
        key = hold.key
        if self.sessions.get(key) is hold:
            del self.sessions[key]
        holds = self.sets.get(key)
        if holds is not None and hold in holds:
            holds.remove(hold)

    def _count_down(self, hold: Hold) -> None:
        holder = hold.identity.holder
        left = self._per_holder.get(holder, 0) - 1
        if left > 0:
            self._per_holder[holder] = left
        else:
            self._per_holder.pop(holder, None)

    async def close(self) -> None:
        """Releases every lease (the service stops)."""
        for hold in [*self.every(), *self._moved]:
            hold.dropped = True
            await self._release(hold)
        self.sessions.clear()
        self.sets.clear()
        self._moved.clear()


__all__ = ["Hold", "HolderLimit", "Holds"]
