"""The SQLite book's own rules, beside the lease contract that both stores
keep (tests/integration/test_lease_rules.py): its writes in flight (a write
that fails changes nothing, in memory or on disk), the expiry heap, and the
walks over a large fleet that let other requests run. A real store on a
file, a fake clock, Faults between the two."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from discovery.book.errors import LeaseNotFound, NoProxyAvailable, StoreUnavailable
from discovery.book.views import TURN
from discovery.selection import Selector
from discovery.sqlite.book import RETRY_S, SqliteBook
from discovery.sqlite.ledger import EXPIRY_SLACK
from health.model import Health
from tests.support.discovery import proxy_entry
from tests.support.lease_world import Books, Clock, Faults, World, fleet_of, grant_all, simple_fleet

ANY = Selector()
T = TypeVar("T")


def run(tmp_path: Path, fleet: Any, scenario: Any, **options: Any) -> None:
    Books("sqlite", str(tmp_path / "leases.db")).run(fleet, scenario, **options)


def faults(w: World) -> Faults:
    assert w.faults is not None
    return w.faults


def book(w: World) -> SqliteBook:
    assert w.sqlite is not None
    return w.sqlite


async def turns_while(work: Awaitable[T]) -> tuple[T, int]:
    """`work`'s result, and how many times another task (standing for other
    requests) got the event loop while `work` was awaited."""
    turns = 0
    running = True

    async def other_requests() -> None:
        nonlocal turns
        while running:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.ensure_future(other_requests())
    await asyncio.sleep(0)
    turns = 0
    try:
        result = await work
    finally:
        running = False
        await other
    return result, turns


def test_ended_leases_do_not_pile_up_for_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every grant schedules its lease's expiry; a release does not unschedule
    it. At a steady 1,000 pairs/s with 5-minute leases that was 300,000 stale
    entries, and the garbage collector walked them in 25-55 ms young
    collections. They are dropped as the heap grows; live ones keep their time."""
    slack = EXPIRY_SLACK // 16  # fewer pairs, the same rule
    monkeypatch.setattr("discovery.sqlite.ledger.EXPIRY_SLACK", slack)
    pairs = 4 * slack

    async def scenario(w: World) -> None:
        held = await w.book.grant("held", ttl=30, selector=ANY, host=None)
        renewed = await w.book.grant("renewed", ttl=10, selector=ANY, host=None)
        for _ in range(pairs):
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            await w.book.release(lease.id)
        await w.book.renew(renewed.id, ttl=40)
        for _ in range(pairs):
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            await w.book.release(lease.id)
        assert book(w).ledger.expiry_entries() <= 2 * 2 + 2 * slack  # 2 live leases; not 4 * pairs
        w.clock.advance(30)  # the held lease's time, the renewed one's not
        assert await w.book.expire_due() == 1
        with pytest.raises(LeaseNotFound):
            await w.book.renew(held.id, ttl=None)
        w.clock.advance(10)
        assert await w.book.expire_due() == 1
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]

    run(tmp_path, simple_fleet(3), scenario, max_ttl=60)


def test_a_grant_the_store_cannot_record_is_not_made(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        faults(w).failing = True
        with pytest.raises(StoreUnavailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        faults(w).failing = False
        assert not (await w.book.proxies_json())[0]["leased"]
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_a_release_the_store_cannot_record_leaves_the_lease_as_it_was(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        faults(w).failing = True
        with pytest.raises(StoreUnavailable):
            await w.book.release(lease.id)
        assert (await w.book.proxies_json())[0]["leased"]
        assert w.rows("SELECT id FROM leases") == [(lease.id,)]
        assert w.sample("discovery_leases_released_total") == 0
        faults(w).failing = False
        # Still the crawler's, in memory as on disk: renew works, nobody else gets p0...
        assert (await w.book.renew(lease.id, ttl=None)).id == lease.id
        with pytest.raises(NoProxyAvailable):
            await w.book.grant("d", ttl=None, selector=ANY, host=None)
        # ...and once really released, p0 is granted again (no UNIQUE failure).
        await w.book.release(lease.id)
        assert (await w.book.grant("d", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_a_report_the_store_cannot_record_starts_no_cooldown(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        faults(w).failing = True
        for outcome, host in (("blocked", "example.com"), ("blocked", None), ("error", None)):
            with pytest.raises(StoreUnavailable):
                await w.book.report(lease.id, outcome, host=host)  # type: ignore[arg-type]
        faults(w).failing = False
        assert (await w.book.proxies_json())[0]["cooldowns"] == []
        assert w.rows("SELECT count(*) FROM cooldowns") == [(0,)]
        assert w.rows("SELECT count(*) FROM reports") == [(0,)]
        assert w.health.errors == []
        assert w.sample("discovery_reports_total", outcome="blocked") == 0
        await w.book.release(lease.id)
        got = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        assert got.proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_an_expiry_the_store_cannot_record_is_retried(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(5)
        faults(w).failing = True
        assert await w.book.expire_due() == 0
        with pytest.raises(NoProxyAvailable):  # p0 is held until its end is recorded
            await w.book.grant("d", ttl=None, selector=ANY, host=None)
        faults(w).failing = False
        # Ended for the crawler (past its time), but its proxy is held until
        # the end is recorded: memory and store both still have the lease.
        with pytest.raises(LeaseNotFound):
            await w.book.renew(lease.id, ttl=None)
        assert (await w.book.proxies_json())[0]["leased"]
        assert w.rows("SELECT id FROM leases") == [(lease.id,)]
        assert await w.book.expire_due() == 0  # not before the retry time
        w.clock.advance(RETRY_S)
        assert await w.book.expire_due() == 1
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]
        assert w.sample("discovery_leases_expired_total") == 1
        assert (await w.book.grant("d", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_a_revocation_the_store_cannot_record_is_retried(tmp_path: Path) -> None:
    fleet = fleet_of(proxy_entry("a", labels={"n": "a"}), proxy_entry("b", labels={"n": "b"}))

    async def scenario(w: World) -> None:
        b = await w.book.grant("c", ttl=None, selector=Selector(labels={"n": "b"}), host=None)
        await w.book.report(b.id, "blocked", host=None)
        faults(w).failing = True
        change = await w.book.apply_fleet(fleet_of(proxy_entry("a", labels={"n": "a"})))
        assert (change.removed, change.revoked) == (["b"], 0)
        with pytest.raises(LeaseNotFound):  # its proxy left: the lease is over for the crawler
            await w.book.renew(b.id, ttl=None)
        faults(w).failing = False
        assert w.rows("SELECT id FROM leases") == [(b.id,)]
        assert w.rows("SELECT proxy FROM cooldowns") == [("b",)]
        w.clock.advance(RETRY_S)
        assert await w.book.expire_due() == 1
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]
        assert w.rows("SELECT count(*) FROM cooldowns") == [(0,)]
        assert w.rows("SELECT proxy FROM usage") == []
        assert w.sample("discovery_leases_revoked_total") == 1

    run(tmp_path, fleet, scenario)


def test_a_proxy_back_in_the_fleet_before_its_revocation_was_recorded_keeps_its_lease(
    tmp_path: Path,
) -> None:
    fleet = fleet_of(proxy_entry("a"), proxy_entry("b"))

    async def scenario(w: World) -> None:
        await w.book.grant("c", ttl=None, selector=ANY, host=None)
        b = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert b.proxy.name == "b"
        faults(w).failing = True
        await w.book.apply_fleet(fleet_of(proxy_entry("a")))
        await w.book.apply_fleet(fleet)  # back before the store could forget it
        faults(w).failing = False
        w.clock.advance(RETRY_S)
        assert await w.book.expire_due() == 0
        assert (await w.book.renew(b.id, ttl=None)).proxy.name == "b"
        assert w.rows("SELECT proxy FROM leases ORDER BY proxy") == [("a",), ("b",)]

    run(tmp_path, fleet, scenario)


def test_a_failed_grant_leaves_the_least_recently_used_order_alone(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        for _ in range(2):  # p0 used first, then p1: p0 is next
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            w.clock.advance(1)
            await w.book.release(lease.id)
        faults(w).failing = True
        with pytest.raises(StoreUnavailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        faults(w).failing = False
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), scenario)


def test_renewals_the_store_cannot_record_leave_the_expiry_as_it_was(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=10, selector=ANY, host=None)
        granted_until = lease.expires_at
        faults(w).hold()
        first = asyncio.ensure_future(w.book.renew(lease.id, ttl=30))
        second = asyncio.ensure_future(w.book.renew(lease.id, ttl=40))
        await asyncio.sleep(0)
        await faults(w).settle(False, False)
        for renewal in (first, second):
            with pytest.raises(StoreUnavailable):
                await renewal
        assert lease.expires_at == granted_until
        assert w.rows("SELECT expires_at FROM leases") == [(granted_until,)]
        # One of two committed: that one holds, in memory as on disk.
        faults(w).hold()
        first = asyncio.ensure_future(w.book.renew(lease.id, ttl=30))
        second = asyncio.ensure_future(w.book.renew(lease.id, ttl=40))
        await asyncio.sleep(0)
        await faults(w).settle(True, False)
        assert (await first).expires_at == w.clock.now + 30
        with pytest.raises(StoreUnavailable):
            await second
        assert lease.expires_at == w.clock.now + 30
        assert w.rows("SELECT expires_at FROM leases") == [(w.clock.now + 30,)]

    run(tmp_path, simple_fleet(1), scenario)


def test_a_renewal_being_committed_when_the_sweep_passes_the_old_end_keeps_the_lease(
    tmp_path: Path,
) -> None:
    """Issue 43, item 2: a sweep that ended a lease whose renewal was still
    being written would answer the crawler 200 and free its proxy to another."""

    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(4)
        faults(w).hold()
        renewal = asyncio.ensure_future(w.book.renew(lease.id, ttl=20))
        await asyncio.sleep(0)
        w.clock.advance(2)  # past the lease's old end, its new one not yet committed
        sweep = asyncio.ensure_future(w.book.expire_due())
        await asyncio.sleep(0)
        held = faults(w).held
        assert held is not None  # the renewal's write, and the sweep's if it ended the lease
        await faults(w).settle(*[True] * len(held))
        assert (await renewal).expires_at == w.clock.now + 18  # the crawler's 200
        # ...and the lease lives, in the store as in memory: its proxy is not
        # freed to another, the sweep ended nothing.
        assert w.rows("SELECT id, expires_at FROM leases") == [(lease.id, w.clock.now + 18)]
        assert await grant_all(w) == []
        assert (await w.book.renew(lease.id, ttl=None)).id == lease.id
        assert await sweep == 0
        assert w.sample("discovery_leases_expired_total") == 0
        w.clock.advance(20)  # at its new end it does expire
        assert await w.book.expire_due() == 1

    run(tmp_path, simple_fleet(1), scenario)


def test_a_lease_being_released_is_gone_for_the_crawler_and_held_for_grants(
    tmp_path: Path,
) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        faults(w).hold()
        release = asyncio.ensure_future(w.book.release(lease.id))
        await asyncio.sleep(0)
        # Until the release is decided: no renewal that could outlive it, no grant of p0.
        with pytest.raises(LeaseNotFound):
            await asyncio.wait_for(w.book.renew(lease.id, ttl=None), 2)
        with pytest.raises(NoProxyAvailable):
            await asyncio.wait_for(w.book.grant("d", ttl=None, selector=ANY, host=None), 2)
        await faults(w).settle(False)
        with pytest.raises(StoreUnavailable):
            await release
        assert (await w.book.renew(lease.id, ttl=None)).id == lease.id
        faults(w).hold()
        release = asyncio.ensure_future(w.book.release(lease.id))
        await asyncio.sleep(0)
        await faults(w).settle(True)
        await release
        assert (await w.book.grant("d", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_a_restore_the_store_cannot_record_ends_nothing_until_it_can(tmp_path: Path) -> None:
    clock = Clock()
    ids: dict[str, str] = {}

    async def before(w: World) -> None:
        for name, ttl in (("p0", 5), ("p1", 60)):
            ids[name] = (await w.book.grant("c", ttl=ttl, selector=ANY, host=None)).id

    async def after(w: World) -> None:
        # p0's lease expired while down, p1 left the fleet: neither end is recorded yet.
        with pytest.raises(NoProxyAvailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        faults(w).failing = False
        assert w.rows("SELECT proxy FROM leases ORDER BY proxy") == [("p0",), ("p1",)]
        w.clock.advance(RETRY_S)
        assert await w.book.expire_due() == 2
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), before, clock=clock)
    clock.advance(10)
    run(tmp_path, simple_fleet(1), after, clock=clock, failing=True)


def test_a_leased_proxy_stays_ungrantable_through_a_resync(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        book(w).ledger.resync_pool()  # the maintenance loop's guard against a missed event
        assert await grant_all(w) == ["p1", "p2"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"
        assert w.rows("SELECT proxy FROM leases ORDER BY proxy") == [("p0",), ("p1",), ("p2",)]

    run(tmp_path, simple_fleet(3), scenario)


def test_the_whole_fleet_as_json_lets_other_requests_run_while_it_is_built(
    tmp_path: Path,
) -> None:
    """10,000 proxies take about 100 ms to build: grants and releases must be
    served in between (the status page asks for them every 2 s)."""
    count = 2000

    async def scenario(w: World) -> None:
        answer, turns = await turns_while(w.book.proxies_json(detail=True))
        assert len(answer) == count
        assert turns >= count // TURN - 1, turns

    run(tmp_path, simple_fleet(count), scenario)


def test_a_missed_health_event_is_repaired_a_few_proxies_at_a_time(tmp_path: Path) -> None:
    """The periodic guard against a missed health event: a proxy the engine
    calls unhealthy leaves the free pool, a healthy one missing from it comes
    back, the others keep their order; a 10,000-proxy rebuild in one go had
    held every request up for 25 ms, so other requests run in between."""
    count = 2000

    async def scenario(w: World) -> None:
        w.health.set("p1", Health.UNHEALTHY)  # told: out of the pool
        # The engine changes its mind about two proxies without telling the book.
        w.health.states["p0"] = replace(w.health.states["p0"], health=Health.UNHEALTHY)
        w.health.states["p1"] = replace(w.health.states["p1"], health=Health.HEALTHY)
        repaired, turns = await turns_while(book(w).repair_pool())
        assert repaired == 2
        assert turns >= count // TURN, turns
        got = [(await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name]
        got.append((await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name)
        # p1 is back (first: never used), p0 is out, the rest in their order.
        assert got == ["p1", "p10"]
        assert await book(w).repair_pool() == 0

    run(tmp_path, simple_fleet(count), scenario)


def test_ended_cooldowns_are_forgotten_a_few_proxies_at_a_time(tmp_path: Path) -> None:
    """Up to 64 cooldowns per proxy of a large fleet: pruning them lets other
    requests run in between, drops the ended ones and keeps the others."""
    count = 1000

    async def scenario(w: World) -> None:
        now = w.clock.now
        # As `blocked` reports leave them (placed directly: this is about the walk).
        for i in range(count):
            book(w).ledger.cooldowns[f"p{i}"] = {"a.example": now + 10, "b.example": now + 100}
        w.clock.advance(50)
        _, turns = await turns_while(book(w).prune_cooldowns())
        assert turns >= count // TURN - 1, turns
        assert all(c == {"b.example": now + 100} for c in book(w).ledger.cooldowns.values())
        assert len(book(w).ledger.cooldowns) == count
        w.clock.advance(50)
        await book(w).prune_cooldowns()
        assert book(w).ledger.cooldowns == {}

    run(tmp_path, simple_fleet(count), scenario)
