"""The lease book's rules, driven directly (no HTTP), with a real store and a fake clock."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry

from discovery.fleet import Fleet, parse_fleet
from discovery.leases import (
    EXPIRY_SLACK,
    RETRY_S,
    TURN,
    LeaseBook,
    LeaseNotFound,
    NoProxyAvailable,
    StoreUnavailable,
)
from discovery.metrics import Metrics
from discovery.selection import Selector
from discovery.store import MAX_TARGET_COOLDOWNS, LeaseStore, Op, StoreError
from health.model import Health
from tests.support.discovery import FakeHealth, manifest, proxy_entry

ANY = Selector()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Faults:
    """Stands between the book and its store: while `failing`, every write
    fails and nothing reaches SQLite (a full disk); after `hold()`, writes
    wait until `settle()` lets each of them commit or fail, in order."""

    def __init__(self, store: LeaseStore) -> None:
        self._real = store.write
        self.failing = False
        self.held: list[tuple[Sequence[Op], asyncio.Future[None]]] | None = None
        store.write = self.write  # type: ignore[method-assign]

    def write(self, ops: Sequence[Op]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failing:
            future.set_exception(StoreError("database or disk is full"))
        elif self.held is not None:
            self.held.append((ops, future))
        else:
            return self._real(ops)
        return future

    def hold(self) -> None:
        self.held = []

    async def settle(self, *commits: bool) -> None:
        """Lets the held writes go, the i-th committing if commits[i]."""
        held, self.held = self.held or [], None
        assert len(held) == len(commits), f"{len(held)} writes held"
        for (ops, future), commit in zip(held, commits, strict=True):
            if commit:
                await self._real(ops)
                future.set_result(None)
            else:
                future.set_exception(StoreError("database or disk is full"))
        await asyncio.sleep(0)  # the waiting callers run on
        await asyncio.sleep(0)


@dataclass
class World:
    book: LeaseBook
    health: FakeHealth
    clock: Clock
    store: LeaseStore
    metrics: Metrics
    db: Path
    faults: Faults

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value

    def rows(self, sql: str) -> list[Any]:
        with sqlite3.connect(self.db) as db:
            return db.execute(sql).fetchall()


def fleet_of(*entries: dict[str, Any]) -> Fleet:
    return parse_fleet(manifest(entries))


def simple_fleet(count: int, **kwargs: Any) -> Fleet:
    return fleet_of(*(proxy_entry(f"p{i}", port=4000 + i, **kwargs) for i in range(count)))


def run(
    tmp_path: Path,
    fleet: Fleet,
    scenario: Callable[[World], Awaitable[None]],
    *,
    max_ttl: float = 60.0,
    cooldown: float = 300.0,
    initial: Health = Health.HEALTHY,
    clock: Clock | None = None,
    failing: bool = False,
) -> None:
    clock = clock or Clock()
    db = tmp_path / "leases.db"

    async def main() -> None:
        store = LeaseStore(db)
        state = store.open()
        faults = Faults(store)
        faults.failing = failing
        metrics = Metrics(CollectorRegistry())
        holder: list[LeaseBook] = []

        class Listener:
            def on_health_change(self, name: str, health: Health) -> None:
                holder[0].on_health_change(name, health)

        health = FakeHealth(Listener(), initial)
        book = LeaseBook(
            store=store,
            health=health,
            metrics=metrics,
            max_ttl=max_ttl,
            cooldown=cooldown,
            probe_interval=5.0,
            clock=clock,
        )
        holder.append(book)
        await book.restore(state, fleet)
        try:
            await scenario(World(book, health, clock, store, metrics, db, faults))
        finally:
            store.close()

    asyncio.run(main())


# -- grant ----------------------------------------------------------------------------------


def test_grant_spreads_use_least_recently_used_first(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        names = []
        for _ in range(6):
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            names.append(lease.proxy.name)
            w.clock.advance(1)
            await w.book.release(lease.id)
        # Not the first proxy over and over: each in turn, then the least recently used again.
        assert names == ["p0", "p1", "p2", "p0", "p1", "p2"]

    run(tmp_path, simple_fleet(3), scenario)


def test_least_recently_used_order_survives_a_restart(tmp_path: Path) -> None:
    fleet = simple_fleet(3)

    async def first(w: World) -> None:
        for _ in range(2):  # p0 then p1 used; p2 never
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            w.clock.advance(1)
            await w.book.release(lease.id)

    async def second(w: World) -> None:
        got = [(await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name]
        got.append((await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name)
        assert got == ["p2", "p0"]

    clock = Clock()
    run(tmp_path, fleet, first, clock=clock)
    run(tmp_path, fleet, second, clock=clock)


def test_grant_answers_the_lease_with_credentials_and_rfc3339_expiry(tmp_path: Path) -> None:
    fleet = fleet_of(proxy_entry("home-0", port=3128, username="crawler", password="p@ss:w/rd"))

    async def scenario(w: World) -> None:
        lease = await w.book.grant("crawler-7", ttl=30, selector=ANY, host=None)
        answer = w.book.lease_json(lease)
        assert answer == {
            "id": lease.id,
            "holder": "crawler-7",
            "proxy": {"name": "home-0", "url": "http://crawler:p%40ss%3Aw%2Frd@127.0.0.1:3128"},
            "expiresAt": "2027-01-15T08:00:30.000Z",
        }

    run(tmp_path, fleet, scenario)


def test_ttl_defaults_to_and_is_capped_by_the_max(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        default = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        capped = await w.book.grant("c", ttl=10_000, selector=ANY, host=None)
        short = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        now = w.clock.now
        assert default.expires_at == now + 60
        assert capped.expires_at == now + 60
        assert short.expires_at == now + 5

    run(tmp_path, simple_fleet(3), scenario, max_ttl=60)


def test_selector_by_provider_zone_and_labels(tmp_path: Path) -> None:
    fleet = fleet_of(
        proxy_entry("a", provider="kvm-home", zone="nas1", labels={"site": "home", "tier": "1"}),
        proxy_entry("b", provider="kvm-home", zone="nas2", labels={"site": "home"}),
        proxy_entry("c", provider="corp", zone=None, labels={"site": "office"}),
    )

    async def scenario(w: World) -> None:
        async def pick(selector: Selector) -> str:
            lease = await w.book.grant("c", ttl=None, selector=selector, host=None)
            await w.book.release(lease.id)
            return lease.proxy.name

        assert await pick(Selector(provider="corp")) == "c"
        assert await pick(Selector(zone="nas2")) == "b"
        assert await pick(Selector(labels={"site": "home", "tier": "1"})) == "a"
        assert await pick(Selector(provider="kvm-home", labels={"site": "home"})) in ("a", "b")
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=Selector(labels={"site": "mars"}), host=None)
        assert denied.value.reason == "no_match"

    run(tmp_path, fleet, scenario)


def test_leases_are_exclusive_under_concurrent_grants(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        results = await asyncio.gather(
            *(w.book.grant(f"c{i}", ttl=None, selector=ANY, host=None) for i in range(200)),
            return_exceptions=True,
        )
        granted = [r for r in results if not isinstance(r, BaseException)]
        denied = [r for r in results if isinstance(r, NoProxyAvailable)]
        assert len(granted) == 50 and len(denied) == 150
        assert len({lease.proxy.name for lease in granted}) == 50
        assert w.rows("SELECT count(*), count(DISTINCT proxy) FROM leases") == [(50, 50)]

    run(tmp_path, simple_fleet(50), scenario)


def test_unhealthy_and_unknown_proxies_are_not_leased(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.reason == "unhealthy"
        assert denied.value.retry_after == 5  # the probe interval: the earliest news
        w.health.set("p1", Health.HEALTHY)
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p1"

    run(tmp_path, simple_fleet(2), scenario, initial=Health.UNKNOWN)


def test_a_proxy_turning_unhealthy_leaves_the_pool(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        w.health.set("p0", Health.UNHEALTHY)
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p1"
        with pytest.raises(NoProxyAvailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)

    run(tmp_path, simple_fleet(2), scenario)


# -- 409 and Retry-After --------------------------------------------------------------------


def test_retry_after_is_when_the_first_matching_proxy_frees_up(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        await w.book.grant("c", ttl=40, selector=ANY, host=None)
        w.clock.advance(10)
        await w.book.grant("c", ttl=20, selector=ANY, host=None)  # free at +30 from now... +20
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.reason == "leased"
        assert denied.value.retry_after == 20
        assert w.sample("discovery_lease_denials_total", reason="leased") == 1

    run(tmp_path, simple_fleet(2), scenario)


def test_retry_after_is_rounded_up_to_whole_seconds(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        await w.book.grant("c", ttl=2.2, selector=ANY, host=None)
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.retry_after == 3

    run(tmp_path, simple_fleet(1), scenario)


# -- renew ----------------------------------------------------------------------------------


def test_renew_extends_but_never_past_the_max_ttl(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=20, selector=ANY, host=None)
        w.clock.advance(15)
        renewed = await w.book.renew(lease.id, ttl=None)  # the lease's own TTL again
        assert renewed.expires_at == w.clock.now + 20
        renewed = await w.book.renew(lease.id, ttl=3600)
        assert renewed.expires_at == w.clock.now + 60  # capped
        assert w.rows("SELECT expires_at FROM leases") == [(w.clock.now + 60,)]

    run(tmp_path, simple_fleet(1), scenario, max_ttl=60)


def test_unknown_or_ended_leases_are_not_found(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        with pytest.raises(LeaseNotFound):
            await w.book.renew("nope", ttl=None)
        lease = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        await w.book.release(lease.id)
        for call in (
            w.book.renew(lease.id, ttl=None),
            w.book.release(lease.id),
            w.book.report(lease.id, "ok", host=None),
        ):
            with pytest.raises(LeaseNotFound):
                await call

    run(tmp_path, simple_fleet(1), scenario)


# -- expiry ---------------------------------------------------------------------------------


def test_expired_leases_end_on_their_own(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(4.9)
        assert await w.book.expire_due() == 0
        w.clock.advance(0.1)
        # Past its time the lease is gone for the API even before the sweep...
        with pytest.raises(LeaseNotFound):
            await w.book.renew(lease.id, ttl=None)
        # ...and the sweep ends it in the store and frees the proxy.
        assert await w.book.expire_due() == 1
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]
        assert w.sample("discovery_leases_expired_total") == 1
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_a_renewed_lease_is_not_expired_at_its_old_time(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(4)
        await w.book.renew(lease.id, ttl=10)
        w.clock.advance(2)
        assert await w.book.expire_due() == 0
        await w.book.renew(lease.id, ttl=None)

    run(tmp_path, simple_fleet(1), scenario)


def test_ended_leases_do_not_pile_up_for_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every grant schedules its lease's expiry; a release does not unschedule
    it. At a steady 1,000 pairs/s with 5-minute leases that was 300,000 stale
    entries, and the garbage collector walked them in 25-55 ms young
    collections. They are dropped as the heap grows; live ones keep their time."""
    slack = EXPIRY_SLACK // 16  # fewer pairs, the same rule
    monkeypatch.setattr("discovery.leases.EXPIRY_SLACK", slack)
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
        assert len(w.book._expiry) <= 2 * 2 + 2 * slack  # 2 live leases; not 4 * pairs
        w.clock.advance(30)  # the held lease's time, the renewed one's not
        assert await w.book.expire_due() == 1
        with pytest.raises(LeaseNotFound):
            await w.book.renew(held.id, ttl=None)
        w.clock.advance(10)
        assert await w.book.expire_due() == 1
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]

    run(tmp_path, simple_fleet(3), scenario, max_ttl=60)


# -- reports and cooldowns ------------------------------------------------------------------


def test_blocked_for_a_target_cools_down_for_that_host_only(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        await w.book.report(lease.id, "blocked", host="example.com")
        await w.book.release(lease.id)
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        assert denied.value.reason == "cooldown"
        assert denied.value.retry_after == 300
        other = await w.book.grant("c", ttl=None, selector=ANY, host="example.org")
        assert other.proxy.name == "p0"
        await w.book.release(other.id)
        w.clock.advance(300)
        assert (
            await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        ).proxy.name == "p0"
        assert w.rows("SELECT outcome, target FROM reports") == [("blocked", "example.com")]

    run(tmp_path, simple_fleet(1), scenario, cooldown=300)


def test_blocked_without_a_target_cools_down_everywhere(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(lease.id, "blocked", host=None)
        await w.book.release(lease.id)
        for host in (None, "example.com", "example.org"):
            with pytest.raises(NoProxyAvailable):
                await w.book.grant("c", ttl=None, selector=ANY, host=host)
        [view] = await w.book.proxies_json()
        assert view["cooldowns"] == [{"target": "*", "until": "2027-01-15T08:05:00.000Z"}]
        assert w.sample("discovery_reports_total", outcome="blocked") == 1

    run(tmp_path, simple_fleet(1), scenario, cooldown=300)


def test_a_cooling_proxy_is_skipped_for_the_next_one(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        first = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        await w.book.report(first.id, "blocked", host="example.com")
        await w.book.release(first.id)
        w.clock.advance(1)
        names = set()
        for _ in range(2):
            names.add(
                (await w.book.grant("c", ttl=None, selector=ANY, host="example.com")).proxy.name
            )
        assert names == {"p1", "p2"}

    run(tmp_path, simple_fleet(3), scenario)


def test_a_leased_and_cooling_proxy_frees_up_at_the_later_of_both(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=30, selector=ANY, host=None)
        await w.book.report(lease.id, "blocked", host="example.com")
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        assert denied.value.retry_after == 100
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host="example.org")
        assert denied.value.retry_after == 30

    run(tmp_path, simple_fleet(1), scenario, cooldown=100)


def test_error_reports_count_against_the_proxys_health(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(lease.id, "error", host="example.com")
        await w.book.report(lease.id, "ok", host=None)
        assert w.health.errors == [("p0", "a crawler reported an error for example.com")]
        assert w.rows("SELECT outcome FROM reports ORDER BY seq") == [("error",), ("ok",)]

    run(tmp_path, simple_fleet(1), scenario)


# -- fleet changes and restarts -------------------------------------------------------------


def test_fleet_change_keeps_leases_of_remaining_proxies_and_ends_the_others(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        a = await w.book.grant("c", ttl=None, selector=Selector(labels={"n": "a"}), host=None)
        b = await w.book.grant("c", ttl=None, selector=Selector(labels={"n": "b"}), host=None)
        await w.book.report(b.id, "blocked", host=None)
        new = fleet_of(
            proxy_entry("a", port=5001, labels={"n": "a"}),  # moved: new port
            proxy_entry("c", labels={"n": "c"}),
        )
        w.health.initial = Health.UNKNOWN
        change = await w.book.apply_fleet(new)
        assert (change.added, change.removed, change.changed) == (["c"], ["b"], ["a"])
        assert (await w.book.renew(a.id, ttl=None)).proxy.url.endswith(":5001")
        with pytest.raises(LeaseNotFound):
            await w.book.renew(b.id, ttl=None)
        assert w.rows("SELECT proxy FROM leases") == [("a",)]
        assert w.rows("SELECT count(*) FROM cooldowns") == [(0,)]
        assert w.sample("discovery_leases_revoked_total") == 1
        # The newcomer is leasable only once it has been probed healthy.
        with pytest.raises(NoProxyAvailable):
            await w.book.grant("c", ttl=None, selector=Selector(labels={"n": "c"}), host=None)
        w.health.set("c", Health.HEALTHY)
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "c"

    fleet = fleet_of(proxy_entry("a", labels={"n": "a"}), proxy_entry("b", labels={"n": "b"}))
    run(tmp_path, fleet, scenario)


def test_restore_keeps_leases_and_cooldowns_and_ends_expired_or_departed(tmp_path: Path) -> None:
    clock = Clock()
    fleet = simple_fleet(3)
    ids: dict[str, str] = {}

    async def before(w: World) -> None:
        for name, ttl in (("p0", 60), ("p1", 5), ("p2", 60)):
            lease = await w.book.grant("c", ttl=ttl, selector=Selector(), host=None)
            assert lease.proxy.name == name
            ids[name] = lease.id
        await w.book.report(ids["p0"], "blocked", host="example.com")

    async def after(w: World) -> None:
        assert await w.book.renew(ids["p0"], ttl=None)
        for gone in ("p1", "p2"):  # p1 expired while down; p2 left the fleet
            with pytest.raises(LeaseNotFound):
                await w.book.renew(ids[gone], ttl=None)
        assert w.rows("SELECT proxy FROM leases") == [("p0",)]
        [p0, p1] = await w.book.proxies_json()
        assert p0["leased"] and p0["cooldowns"][0]["target"] == "example.com"
        assert not p1["leased"]

    run(tmp_path, fleet, before, clock=clock)
    clock.advance(10)
    run(tmp_path, simple_fleet(2), after, clock=clock)


# -- the store failing ----------------------------------------------------------------------


def test_a_grant_the_store_cannot_record_is_not_made(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        real_write = w.store.write

        def failing(ops: Any) -> Any:
            future = asyncio.get_running_loop().create_future()
            future.set_exception(StoreError("disk full"))
            return future

        w.store.write = failing  # type: ignore[method-assign]
        with pytest.raises(StoreUnavailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.store.write = real_write  # type: ignore[method-assign]
        assert not (await w.book.proxies_json())[0]["leased"]
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(1), scenario)


def test_metrics_snapshot(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        w.health.set("p2", Health.UNHEALTHY)
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(lease.id, "blocked", host="x.example")
        snapshot = w.book.snapshot()
        assert snapshot.leases_active == 1
        assert snapshot.cooldowns_active == 1
        assert snapshot.proxies_by_health == {"healthy": 2, "unhealthy": 1, "unknown": 0}

    run(tmp_path, simple_fleet(3), scenario)


def test_a_grant_does_not_wait_for_the_sweep_to_free_an_expired_lease(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        old = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(5)
        new = await w.book.grant("d", ttl=None, selector=ANY, host=None)  # no expire_due() between
        assert new.proxy.name == "p0"
        assert w.rows("SELECT id FROM leases") == [(new.id,)]
        assert w.sample("discovery_leases_expired_total") == 1
        with pytest.raises(LeaseNotFound):
            await w.book.release(old.id)

    run(tmp_path, simple_fleet(1), scenario)


# -- a write that fails changes nothing (memory and store alike) ---------------------------


def test_a_release_the_store_cannot_record_leaves_the_lease_as_it_was(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.faults.failing = True
        with pytest.raises(StoreUnavailable):
            await w.book.release(lease.id)
        assert (await w.book.proxies_json())[0]["leased"]
        assert w.rows("SELECT id FROM leases") == [(lease.id,)]
        assert w.sample("discovery_leases_released_total") == 0
        w.faults.failing = False
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
        w.faults.failing = True
        for outcome, host in (("blocked", "example.com"), ("blocked", None), ("error", None)):
            with pytest.raises(StoreUnavailable):
                await w.book.report(lease.id, outcome, host=host)  # type: ignore[arg-type]
        w.faults.failing = False
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
        w.faults.failing = True
        assert await w.book.expire_due() == 0
        with pytest.raises(NoProxyAvailable):  # p0 is held until its end is recorded
            await w.book.grant("d", ttl=None, selector=ANY, host=None)
        w.faults.failing = False
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
        w.faults.failing = True
        change = await w.book.apply_fleet(fleet_of(proxy_entry("a", labels={"n": "a"})))
        assert (change.removed, change.revoked) == (["b"], 0)
        with pytest.raises(LeaseNotFound):  # its proxy left: the lease is over for the crawler
            await w.book.renew(b.id, ttl=None)
        w.faults.failing = False
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
        w.faults.failing = True
        await w.book.apply_fleet(fleet_of(proxy_entry("a")))
        await w.book.apply_fleet(fleet)  # back before the store could forget it
        w.faults.failing = False
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
        w.faults.failing = True
        with pytest.raises(StoreUnavailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.faults.failing = False
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), scenario)


def test_renewals_the_store_cannot_record_leave_the_expiry_as_it_was(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=10, selector=ANY, host=None)
        granted_until = lease.expires_at
        w.faults.hold()
        first = asyncio.ensure_future(w.book.renew(lease.id, ttl=30))
        second = asyncio.ensure_future(w.book.renew(lease.id, ttl=40))
        await asyncio.sleep(0)
        await w.faults.settle(False, False)
        for renewal in (first, second):
            with pytest.raises(StoreUnavailable):
                await renewal
        assert lease.expires_at == granted_until
        assert w.rows("SELECT expires_at FROM leases") == [(granted_until,)]
        # One of two committed: that one holds, in memory as on disk.
        w.faults.hold()
        first = asyncio.ensure_future(w.book.renew(lease.id, ttl=30))
        second = asyncio.ensure_future(w.book.renew(lease.id, ttl=40))
        await asyncio.sleep(0)
        await w.faults.settle(True, False)
        assert (await first).expires_at == w.clock.now + 30
        with pytest.raises(StoreUnavailable):
            await second
        assert lease.expires_at == w.clock.now + 30
        assert w.rows("SELECT expires_at FROM leases") == [(w.clock.now + 30,)]

    run(tmp_path, simple_fleet(1), scenario)


def test_a_lease_being_released_is_gone_for_the_crawler_and_held_for_grants(
    tmp_path: Path,
) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.faults.hold()
        release = asyncio.ensure_future(w.book.release(lease.id))
        await asyncio.sleep(0)
        # Until the release is decided: no renewal that could outlive it, no grant of p0.
        with pytest.raises(LeaseNotFound):
            await asyncio.wait_for(w.book.renew(lease.id, ttl=None), 2)
        with pytest.raises(NoProxyAvailable):
            await asyncio.wait_for(w.book.grant("d", ttl=None, selector=ANY, host=None), 2)
        await w.faults.settle(False)
        with pytest.raises(StoreUnavailable):
            await release
        assert (await w.book.renew(lease.id, ttl=None)).id == lease.id
        w.faults.hold()
        release = asyncio.ensure_future(w.book.release(lease.id))
        await asyncio.sleep(0)
        await w.faults.settle(True)
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
        w.faults.failing = False
        assert w.rows("SELECT proxy FROM leases ORDER BY proxy") == [("p0",), ("p1",)]
        w.clock.advance(RETRY_S)
        assert await w.book.expire_due() == 2
        assert w.rows("SELECT count(*) FROM leases") == [(0,)]
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), before, clock=clock)
    clock.advance(10)
    run(tmp_path, simple_fleet(1), after, clock=clock, failing=True)


def test_cooldowns_per_proxy_are_capped_in_memory_as_in_the_store(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        for i in range(MAX_TARGET_COOLDOWNS):
            await w.book.report(lease.id, "blocked", host=f"t{i}.example")
        [view] = await w.book.proxies_json()
        assert len(view["cooldowns"]) == MAX_TARGET_COOLDOWNS
        w.clock.advance(1)
        await w.book.report(lease.id, "blocked", host="one-more.example")
        [view] = await w.book.proxies_json()
        assert view["cooldowns"] == [{"target": "*", "until": "2027-01-15T08:05:01.000Z"}]
        assert w.rows("SELECT target, until FROM cooldowns") == [("*", w.clock.now + 300)]
        await w.book.release(lease.id)
        for host in ("t0.example", "other.example", None):
            with pytest.raises(NoProxyAvailable):
                await w.book.grant("c", ttl=None, selector=ANY, host=host)

    run(tmp_path, simple_fleet(1), scenario, cooldown=300)


# -- a leased proxy is never granted again --------------------------------------------------
# Each event below refills or reorders the free pool. A leased proxy must stay
# out of it: the store's UNIQUE(proxy) would refuse the second grant, but as a
# 503 (StoreUnavailable), not the clean 409 a crawler expects.


T = TypeVar("T")


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


async def grant_all(w: World, host: str | None = None) -> list[str]:
    """Grants until the book refuses (409, everything leased); the proxies
    granted, in order. A double grant raises StoreUnavailable instead."""
    names: list[str] = []
    while len(names) <= 10:  # more than any fleet here: a loop would be a bug
        try:
            lease = await w.book.grant("other", ttl=None, selector=ANY, host=host)
        except NoProxyAvailable as refused:
            assert refused.reason == "leased"
            return names
        names.append(lease.proxy.name)
    raise AssertionError(f"the book kept granting: {names}")


def test_a_leased_proxy_stays_ungrantable_through_a_resync(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.book.resync_pool()  # the maintenance loop's guard against a missed event
        assert await grant_all(w) == ["p1", "p2"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"
        assert w.rows("SELECT proxy FROM leases ORDER BY proxy") == [("p0",), ("p1",), ("p2",)]

    run(tmp_path, simple_fleet(3), scenario)


def test_a_leased_proxy_stays_ungrantable_through_a_health_flap(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.health.set("p0", Health.UNHEALTHY)
        w.health.set("p0", Health.HEALTHY)  # healthy again, but still leased
        assert await grant_all(w) == ["p1"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), scenario)


def test_a_leased_proxy_stays_ungrantable_through_a_fleet_reload(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.apply_fleet(simple_fleet(2))  # the same fleet again
        # p0 moves, p1 leaves, p2 joins: p0's lease is kept, so p0 stays taken.
        await w.book.apply_fleet(
            fleet_of(proxy_entry("p0", port=5000), proxy_entry("p2", port=4002))
        )
        assert await grant_all(w) == ["p2"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.url.endswith(":5000")
        assert w.rows("SELECT proxy FROM leases ORDER BY proxy") == [("p0",), ("p2",)]

    run(tmp_path, simple_fleet(2), scenario)


def test_a_leased_proxy_stays_ungrantable_when_its_cooldown_ends(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        await w.book.report(held.id, "blocked", host="example.com")
        w.clock.advance(31)  # the cooldown is over, the lease (60 s) is not
        await w.book.prune_cooldowns()  # what the maintenance loop does, in its order
        assert await w.book.repair_pool() == 0
        assert await grant_all(w, host="example.com") == ["p1"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), scenario, max_ttl=60, cooldown=30)


def test_a_leased_proxy_stays_ungrantable_when_another_lease_expires(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=60, selector=ANY, host=None)
        await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(5)
        assert await w.book.expire_due() == 1  # p1 is free again, p0 is not
        assert await grant_all(w) == ["p1"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"

    run(tmp_path, simple_fleet(2), scenario)


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
        repaired, turns = await turns_while(w.book.repair_pool())
        assert repaired == 2
        assert turns >= count // TURN, turns
        got = [(await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name]
        got.append((await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name)
        # p1 is back (first: never used), p0 is out, the rest in their order.
        assert got == ["p1", "p10"]
        assert await w.book.repair_pool() == 0

    run(tmp_path, simple_fleet(count), scenario)


def test_ended_cooldowns_are_forgotten_a_few_proxies_at_a_time(tmp_path: Path) -> None:
    """Up to 64 cooldowns per proxy of a large fleet: pruning them lets other
    requests run in between, drops the ended ones and keeps the others."""
    count = 1000

    async def scenario(w: World) -> None:
        now = w.clock.now
        # As `blocked` reports leave them (placed directly: this is about the walk).
        for i in range(count):
            w.book._cooldowns[f"p{i}"] = {"a.example": now + 10, "b.example": now + 100}
        w.clock.advance(50)
        _, turns = await turns_while(w.book.prune_cooldowns())
        assert turns >= count // TURN - 1, turns
        assert all(c == {"b.example": now + 100} for c in w.book._cooldowns.values())
        assert len(w.book._cooldowns) == count
        w.clock.advance(50)
        await w.book.prune_cooldowns()
        assert w.book._cooldowns == {}

    run(tmp_path, simple_fleet(count), scenario)
