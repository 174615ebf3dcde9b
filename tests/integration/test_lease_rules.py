"""The lease contract (discovery/book/contract.py), held against both stores:
every rule here runs on the SQLite book and on the PostgreSQL book (a real
server from scripts/postgres), driven directly (no HTTP) with one fake clock
given to both. What only one store has (the SQLite book's writes in flight,
the replicas' leadership) is tested beside it, in that store's own files."""

from __future__ import annotations

import asyncio

import pytest

from discovery.book.errors import LeaseNotFound, NoProxyAvailable
from discovery.book.rules import MAX_TARGET_COOLDOWNS
from discovery.book.views import lease_json
from discovery.postgres.fleets import FLEET_TTL_S
from discovery.selection import Selector
from health.model import Health
from tests.support.discovery import proxy_entry
from tests.support.lease_world import (
    Books,
    Clock,
    World,
    fleet_of,
    grant_all,
    simple_fleet,
)
from tests.support.lease_world import books as books
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

ANY = Selector()


def at(seconds: float) -> object:
    """A time on the fake clock, to the millisecond (PostgreSQL keeps
    microseconds). pytest.approx's default, a millionth of the epoch
    seconds, is half an hour: a TTL of 20 s would pass for 60."""
    return pytest.approx(seconds, rel=0, abs=1e-3)


# -- grant ----------------------------------------------------------------------------------


def test_grant_spreads_use_least_recently_used_first(books: Books) -> None:
    async def scenario(w: World) -> None:
        names = []
        for _ in range(6):
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            names.append(lease.proxy.name)
            w.clock.advance(1)
            await w.book.release(lease.id)
        # Not the first proxy over and over: each in turn, then the least recently used again.
        assert names == ["p0", "p1", "p2", "p0", "p1", "p2"]

    books.run(simple_fleet(3), scenario)


def test_least_recently_used_is_by_grant_never_used_first_by_name(books: Books) -> None:
    """The order is the same on both stores: never used proxies first, by
    name, whatever order they became healthy in; then by when each was last
    granted (not released), ties by name."""

    async def scenario(w: World) -> None:
        for name in ("p3", "p1", "p2", "p0"):
            w.health.set(name, Health.HEALTHY)
        a = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.clock.advance(1)
        b = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert (a.proxy.name, b.proxy.name) == ("p0", "p1")
        w.clock.advance(1)
        await w.book.release(b.id)  # released first, but granted last
        await w.book.release(a.id)
        got = [(await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name]
        for _ in range(3):
            got.append((await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name)
        assert got == ["p2", "p3", "p0", "p1"]

    books.run(simple_fleet(4), scenario, initial=Health.UNKNOWN)


def test_least_recently_used_order_survives_a_restart(books: Books) -> None:
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
    books.run(fleet, first, clock=clock)
    books.run(fleet, second, clock=clock)


def test_grant_answers_the_lease_with_credentials_and_rfc3339_expiry(books: Books) -> None:
    fleet = fleet_of(proxy_entry("home-0", port=3128, username="crawler", password="p@ss:w/rd"))

    async def scenario(w: World) -> None:
        lease = await w.book.grant("crawler-7", ttl=30, selector=ANY, host=None)
        assert lease_json(lease) == {
            "id": lease.id,
            "holder": "crawler-7",
            "proxy": {"name": "home-0", "url": "http://crawler:p%40ss%3Aw%2Frd@127.0.0.1:3128"},
            "expiresAt": "2027-01-15T08:00:30.000Z",
        }

    books.run(fleet, scenario)


def test_ttl_defaults_to_and_is_capped_by_the_max(books: Books) -> None:
    async def scenario(w: World) -> None:
        default = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        capped = await w.book.grant("c", ttl=10_000, selector=ANY, host=None)
        short = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        now = w.clock.now
        assert default.expires_at == at(now + 60)
        assert capped.expires_at == at(now + 60)
        assert short.expires_at == at(now + 5)

    books.run(simple_fleet(3), scenario, max_ttl=60)


def test_selector_by_provider_zone_and_labels(books: Books) -> None:
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

    books.run(fleet, scenario)


def test_leases_are_exclusive_under_concurrent_grants(books: Books) -> None:
    async def scenario(w: World) -> None:
        results = await asyncio.gather(
            *(w.book.grant(f"c{i}", ttl=None, selector=ANY, host=None) for i in range(120)),
            return_exceptions=True,
        )
        granted = [r for r in results if not isinstance(r, BaseException)]
        denied = [r for r in results if isinstance(r, NoProxyAvailable)]
        assert len(granted) == 30 and len(denied) == 90
        assert len({lease.proxy.name for lease in granted}) == 30
        stored = w.stored_leases()
        assert len(stored) == 30 and len({proxy for _, proxy, _ in stored}) == 30

    books.run(simple_fleet(30), scenario)


def test_unhealthy_and_unknown_proxies_are_not_leased(books: Books) -> None:
    async def scenario(w: World) -> None:
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.reason == "unhealthy"
        assert denied.value.retry_after == 5  # the probe interval: the earliest news
        w.health.set("p1", Health.HEALTHY)
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p1"

    books.run(simple_fleet(2), scenario, initial=Health.UNKNOWN)


def test_a_proxy_turning_unhealthy_leaves_the_pool(books: Books) -> None:
    async def scenario(w: World) -> None:
        w.health.set("p0", Health.UNHEALTHY)
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p1"
        with pytest.raises(NoProxyAvailable):
            await w.book.grant("c", ttl=None, selector=ANY, host=None)

    books.run(simple_fleet(2), scenario)


# -- 409 and Retry-After --------------------------------------------------------------------


def test_retry_after_is_when_the_first_matching_proxy_frees_up(books: Books) -> None:
    async def scenario(w: World) -> None:
        await w.book.grant("c", ttl=40, selector=ANY, host=None)
        w.clock.advance(10)
        await w.book.grant("c", ttl=20, selector=ANY, host=None)  # free in 20 s, the other in 30
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.reason == "leased"
        assert denied.value.retry_after == 20
        assert w.sample("discovery_lease_denials_total", reason="leased") == 1

    books.run(simple_fleet(2), scenario)


def test_retry_after_is_rounded_up_to_whole_seconds(books: Books) -> None:
    async def scenario(w: World) -> None:
        await w.book.grant("c", ttl=2.2, selector=ANY, host=None)
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.retry_after == 3

    books.run(simple_fleet(1), scenario)


# -- renew, report, release -----------------------------------------------------------------


def test_renew_extends_but_never_past_the_max_ttl(books: Books) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=20, selector=ANY, host=None)
        w.clock.advance(15)
        renewed = await w.book.renew(lease.id, ttl=None)  # the lease's own TTL again
        assert renewed.expires_at == at(w.clock.now + 20)
        renewed = await w.book.renew(lease.id, ttl=3600)
        assert renewed.expires_at == at(w.clock.now + 60)  # capped
        [(_, _, stored)] = w.stored_leases()
        assert stored == at(w.clock.now + 60)

    books.run(simple_fleet(1), scenario, max_ttl=60)


def test_a_renewal_without_a_ttl_is_capped_by_a_max_lowered_since_the_grant(
    books: Books,
) -> None:
    """Issue 43, item 3: a restart with a smaller --max-lease-ttl (or another
    replica's) caps the lease's own TTL that a renewal without one reuses."""
    clock = Clock()
    ids: list[str] = []

    async def granted(w: World) -> None:
        ids.append((await w.book.grant("c", ttl=None, selector=ANY, host=None)).id)

    async def lowered(w: World) -> None:
        w.clock.advance(10)
        renewed = await w.book.renew(ids[0], ttl=None)
        assert renewed.expires_at == at(w.clock.now + 20)
        [(_, _, stored)] = w.stored_leases()
        assert stored == at(w.clock.now + 20)
        w.clock.advance(20)
        assert await w.book.expire_due() == 1

    books.run(simple_fleet(1), granted, clock=clock, max_ttl=60)
    books.run(simple_fleet(1), lowered, clock=clock, max_ttl=20)


def test_unknown_or_ended_leases_are_not_found(books: Books) -> None:
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

    books.run(simple_fleet(1), scenario)


@pytest.mark.parametrize("lease_id", ["\x00", "a\x00" * 11, "%00", "x" * 5000, "é" * 22])
def test_a_lease_id_no_grant_could_make_is_not_found_and_never_stored(
    books: Books, lease_id: str
) -> None:
    """Defect 4: a NUL in a lease id reached PostgreSQL and came back a 500."""

    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        for call in (
            w.book.renew(lease_id, ttl=None),
            w.book.report(lease_id, "blocked", host=None),
            w.book.release(lease_id),
        ):
            with pytest.raises(LeaseNotFound):
                await call
        assert w.stored_cooldowns() == [] and w.stored_reports() == []
        assert [row[0] for row in w.stored_leases()] == [lease.id]

    books.run(simple_fleet(1), scenario)


# -- expiry ---------------------------------------------------------------------------------


def test_expired_leases_end_on_their_own(books: Books) -> None:
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
        assert w.stored_leases() == []
        assert w.sample("discovery_leases_expired_total") == 1
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p0"

    books.run(simple_fleet(1), scenario)


def test_a_renewed_lease_is_not_expired_at_its_old_time(books: Books) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(4)
        await w.book.renew(lease.id, ttl=10)
        w.clock.advance(2)
        assert await w.book.expire_due() == 0
        await w.book.renew(lease.id, ttl=None)

    books.run(simple_fleet(1), scenario)


def test_a_grant_does_not_wait_for_the_sweep_to_free_an_expired_lease(books: Books) -> None:
    async def scenario(w: World) -> None:
        old = await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(5)
        new = await w.book.grant("d", ttl=None, selector=ANY, host=None)  # no expire_due() between
        assert new.proxy.name == "p0"
        assert [row[0] for row in w.stored_leases()] == [new.id]
        assert w.sample("discovery_leases_expired_total") == 1
        with pytest.raises(LeaseNotFound):
            await w.book.release(old.id)

    books.run(simple_fleet(1), scenario)


def test_every_expired_lease_is_counted_once_when_grants_replace_them(books: Books) -> None:
    """Defect 6: 20 leases past their time, granted again at once before any
    sweep: PostgreSQL counted 3 expiries (the grant replaced the row in place)."""

    async def scenario(w: World) -> None:
        await asyncio.gather(
            *(w.book.grant("c", ttl=1, selector=ANY, host=None) for _ in range(20))
        )
        w.clock.advance(1)
        for _ in range(20):
            await w.book.grant("d", ttl=9, selector=ANY, host=None)
        assert await w.book.expire_due() == 0
        assert w.sample("discovery_leases_expired_total") == 20
        assert len(w.stored_leases()) == 20

    books.run(simple_fleet(20), scenario)


# -- reports and cooldowns ------------------------------------------------------------------


def test_blocked_for_a_target_cools_down_for_that_host_only(books: Books) -> None:
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
        again = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        assert again.proxy.name == "p0"
        assert w.stored_reports() == [("blocked", "example.com")]

    books.run(simple_fleet(1), scenario, cooldown=300)


def test_blocked_without_a_target_cools_down_everywhere(books: Books) -> None:
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

    books.run(simple_fleet(1), scenario, cooldown=300)


def test_a_cooling_proxy_is_skipped_for_the_next_one(books: Books) -> None:
    async def scenario(w: World) -> None:
        first = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        await w.book.report(first.id, "blocked", host="example.com")
        await w.book.release(first.id)
        w.clock.advance(1)
        names = set()
        for _ in range(2):
            lease = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
            names.add(lease.proxy.name)
        assert names == {"p1", "p2"}

    books.run(simple_fleet(3), scenario)


def test_an_everywhere_cooldown_keeps_the_proxy_from_a_named_target(books: Books) -> None:
    async def scenario(w: World) -> None:
        first = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        second = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(first.id, "blocked", host=None)
        for lease in (first, second):
            await w.book.release(lease.id)
        # p0 would come first (used as long ago as p1, and first by name).
        got = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        assert got.proxy.name == "p1"

    books.run(simple_fleet(2), scenario)


def test_cooling_tells_whether_a_leased_proxy_cools_down_for_a_site(books: Books) -> None:
    """What a holder using one lease for several sites (the gateway's
    sessions) asks before each new site."""

    async def scenario(w: World) -> None:
        blocked = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(blocked.id, "blocked", host="shop.example")
        assert await w.book.cooling(blocked.id, "shop.example")
        assert not await w.book.cooling(blocked.id, "other.example")
        everywhere = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(everywhere.id, "blocked", host=None)
        assert await w.book.cooling(everywhere.id, "other.example")
        w.clock.advance(101)  # the cooldowns are over
        await w.book.renew(blocked.id, ttl=None)
        assert not await w.book.cooling(blocked.id, "shop.example")
        await w.book.release(everywhere.id)
        for gone in (everywhere.id, "not-a-lease-id"):
            with pytest.raises(LeaseNotFound):
                await w.book.cooling(gone, "shop.example")

    books.run(simple_fleet(2), scenario, max_ttl=300, cooldown=100)


def test_a_leased_and_cooling_proxy_frees_up_at_the_later_of_both(books: Books) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=30, selector=ANY, host=None)
        await w.book.report(lease.id, "blocked", host="example.com")
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        assert denied.value.retry_after == 100
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host="example.org")
        assert denied.value.retry_after == 30

    books.run(simple_fleet(1), scenario, cooldown=100)


def test_cooldowns_per_proxy_are_capped_by_widening_to_every_target(books: Books) -> None:
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
        [(proxy, target, until)] = w.stored_cooldowns()
        assert (proxy, target) == ("p0", "*") and until == at(w.clock.now + 300)
        await w.book.release(lease.id)
        for host in ("t0.example", "other.example", None):
            with pytest.raises(NoProxyAvailable):
                await w.book.grant("c", ttl=None, selector=ANY, host=host)

    books.run(simple_fleet(1), scenario, cooldown=300)


def test_error_reports_count_against_the_proxys_health(books: Books) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(lease.id, "error", host="example.com")
        await w.book.report(lease.id, "ok", host=None)
        assert w.health.errors == [("p0", "a crawler reported an error for example.com")]
        assert w.stored_reports() == [("error", "example.com"), ("ok", None)]

    books.run(simple_fleet(1), scenario)


def test_each_error_report_counts(books: Books) -> None:
    """Defect 5: ten quick `error` reports reached PostgreSQL's prober as one."""

    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await asyncio.gather(*(w.book.report(lease.id, "error", host=None) for _ in range(10)))
        assert w.health.errors == [("p0", "a crawler reported an error")] * 10
        assert w.sample("discovery_reports_total", outcome="error") == 10

    books.run(simple_fleet(1), scenario)


def test_latency_is_shown_alike_on_both_stores(books: Books) -> None:
    async def scenario(w: World) -> None:
        w.health.set("p0", Health.HEALTHY)
        w.health.states["p0"] = w.health.states["p0"].__class__(
            "p0", Health.HEALTHY, 12.345678, None, None
        )
        await w.book.grant(
            "c", ttl=None, selector=ANY, host=None
        )  # the leader's flush, on PostgreSQL
        [view] = await w.book.proxies_json()
        assert view["latencyMs"] == 12.346

    books.run(simple_fleet(1), scenario)


# -- fleet changes and restarts -------------------------------------------------------------


def test_fleet_change_keeps_leases_of_remaining_proxies_and_ends_the_others(books: Books) -> None:
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
        assert [row[1] for row in w.stored_leases()] == ["a"]
        assert w.stored_cooldowns() == []
        assert w.sample("discovery_leases_revoked_total") == 1
        # The newcomer is leasable only once it has been probed healthy.
        with pytest.raises(NoProxyAvailable):
            await w.book.grant("c", ttl=None, selector=Selector(labels={"n": "c"}), host=None)
        w.health.set("c", Health.HEALTHY)
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "c"

    fleet = fleet_of(proxy_entry("a", labels={"n": "a"}), proxy_entry("b", labels={"n": "b"}))
    books.run(fleet, scenario)


def test_restore_keeps_leases_and_cooldowns_and_ends_expired_or_departed(books: Books) -> None:
    clock = Clock()
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
        [p0, p1] = await w.book.proxies_json()
        assert p0["leased"] and p0["cooldowns"][0]["target"] == "example.com"
        assert not p1["leased"]
        assert (await w.snapshot()).leases_active == 1

    books.run(simple_fleet(3), before, clock=clock)
    clock.advance(10)
    books.run(simple_fleet(2), after, clock=clock)


def test_a_lease_on_a_proxy_the_fleet_lacks_is_not_renewed_reported_or_released(
    books: Books,
) -> None:
    """Defects 1 and 2: a replica restarted with a fleet that lacks the
    lease's proxy answered 404 to a renewal but extended the lease anyway,
    and took reports (a cooldown, an error) and the release of it."""
    clock = Clock()
    ids: dict[str, str] = {}

    async def before(w: World) -> None:
        for name in ("p0", "p1"):
            ids[name] = (await w.book.grant("c", ttl=6, selector=ANY, host=None)).id

    async def after(w: World) -> None:
        stored = dict((row[1], row[2]) for row in w.stored_leases())
        w.clock.advance(1)
        for call in (
            w.book.renew(ids["p1"], ttl=20),
            w.book.report(ids["p1"], "blocked", host=None),
            w.book.report(ids["p1"], "error", host=None),
            w.book.release(ids["p1"]),
        ):
            with pytest.raises(LeaseNotFound):
                await call
        after = dict((row[1], row[2]) for row in w.stored_leases())
        assert after.get("p1", stored.get("p1")) == stored.get("p1")  # never extended
        assert w.stored_cooldowns() == [] and w.stored_reports() == []
        assert w.health.errors == []
        assert (await w.book.renew(ids["p0"], ttl=None)).proxy.name == "p0"

    books.run(simple_fleet(2), before, clock=clock)
    books.run(simple_fleet(1), after, clock=clock)


def test_a_lease_that_answered_404_stays_ended_when_its_proxy_comes_back(books: Books) -> None:
    """Issue 39, finding 4: on PostgreSQL a lease whose proxy the restarted
    replica's fleet lacked answered 404, and came back (renewable, its proxy
    refused to new grants) once the proxy was back in the fleet. 404 means
    the lease has ended, for good."""
    clock = Clock()
    ids: dict[str, str] = {}

    async def before(w: World) -> None:
        for name in ("p0", "p1"):
            ids[name] = (await w.book.grant("c", ttl=60, selector=ANY, host=None)).id

    async def after(w: World) -> None:
        with pytest.raises(LeaseNotFound):
            await w.book.renew(ids["p1"], ttl=None)
        await w.book.apply_fleet(simple_fleet(2))  # p1 is back
        with pytest.raises(LeaseNotFound):
            await w.book.renew(ids["p1"], ttl=None)
        with pytest.raises(LeaseNotFound):
            await w.book.report(ids["p1"], "ok", host=None)
        with pytest.raises(LeaseNotFound):
            await w.book.release(ids["p1"])
        assert (await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name == "p1"
        assert [row[1] for row in w.stored_leases()] == ["p0", "p1"]
        assert w.stored_reports() == []

    books.run(simple_fleet(2), before, clock=clock)
    books.run(simple_fleet(1), after, clock=clock)


def test_a_selector_matching_only_proxies_that_left_is_refused_with_409(books: Books) -> None:
    """Defect 3: after a fleet swap across a restart, PostgreSQL kept the old
    proxies, granted them, gave them back and answered 503 forever."""
    old = fleet_of(*(proxy_entry(f"old{i}", port=4000 + i, zone="z2") for i in range(3)))
    new = fleet_of(*(proxy_entry(f"new{i}", port=5000 + i, zone="z1") for i in range(2)))
    clock = Clock()

    async def before(w: World) -> None:
        await w.book.grant("c", ttl=None, selector=ANY, host=None)

    async def after(w: World) -> None:
        for _ in range(3):
            with pytest.raises(NoProxyAvailable) as denied:
                await w.book.grant("c", ttl=None, selector=Selector(zone="z2"), host=None)
            assert denied.value.reason == "no_match"
        got = {(await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name}
        got.add((await w.book.grant("c", ttl=None, selector=ANY, host=None)).proxy.name)
        assert got == {"new0", "new1"}
        with pytest.raises(NoProxyAvailable) as denied:
            await w.book.grant("c", ttl=None, selector=ANY, host=None)
        assert denied.value.reason == "leased"
        assert [p["name"] for p in await w.book.proxies_json()] == ["new0", "new1"]

    books.run(old, before, clock=clock)
    books.run(new, after, clock=clock)


def test_proxies_that_left_every_fleet_leave_the_store(books: Books) -> None:
    """Defect 3's other half: PostgreSQL kept departed proxies (healthy, with
    their leases and cooldowns) for ever. Now a fleet no replica registers
    any more is dropped after FLEET_TTL_S, with what only it held; SQLite
    forgets them at the restart."""
    clock = Clock()

    async def before(w: World) -> None:
        for name in ("p0", "p1"):
            lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
            assert lease.proxy.name == name
        await w.book.report(lease.id, "blocked", host="x.example")

    async def after(w: World) -> None:
        w.clock.advance(FLEET_TTL_S + 1)
        await w.book.maintain()
        assert [row[1] for row in w.stored_leases()] == ["p0"]
        assert w.stored_cooldowns() == []
        assert w.sample("discovery_leases_revoked_total") == 1

    books.run(simple_fleet(2), before, clock=clock, max_ttl=3600)
    books.run(simple_fleet(1), after, clock=clock, max_ttl=3600)


def test_metrics_snapshot(books: Books) -> None:
    async def scenario(w: World) -> None:
        w.health.set("p2", Health.UNHEALTHY)
        lease = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.report(lease.id, "blocked", host="x.example")
        snapshot = await w.snapshot()
        assert snapshot.leases_active == 1
        assert snapshot.cooldowns_active == 1
        assert snapshot.proxies_by_health == {"healthy": 2, "unhealthy": 1, "unknown": 0}

    books.run(simple_fleet(3), scenario)


# -- a leased proxy is never granted again --------------------------------------------------


def test_a_leased_proxy_stays_ungrantable_through_a_health_flap(books: Books) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        w.health.set("p0", Health.UNHEALTHY)
        w.health.set("p0", Health.HEALTHY)  # healthy again, but still leased
        assert await grant_all(w) == ["p1"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"

    books.run(simple_fleet(2), scenario)


def test_a_leased_proxy_stays_ungrantable_through_a_fleet_reload(books: Books) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host=None)
        await w.book.apply_fleet(simple_fleet(2))  # the same fleet again
        # p0 moves, p1 leaves, p2 joins: p0's lease is kept, so p0 stays taken.
        await w.book.apply_fleet(
            fleet_of(proxy_entry("p0", port=5000), proxy_entry("p2", port=4002))
        )
        assert await grant_all(w) == ["p2"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.url.endswith(":5000")
        assert [row[1] for row in w.stored_leases()] == ["p0", "p2"]

    books.run(simple_fleet(2), scenario)


def test_a_leased_proxy_stays_ungrantable_when_its_cooldown_ends(books: Books) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=None, selector=ANY, host="example.com")
        await w.book.report(held.id, "blocked", host="example.com")
        w.clock.advance(31)  # the cooldown is over, the lease (60 s) is not
        await w.book.maintain()
        assert await grant_all(w, host="example.com") == ["p1"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"

    books.run(simple_fleet(2), scenario, max_ttl=60, cooldown=30)


def test_a_leased_proxy_stays_ungrantable_when_another_lease_expires(books: Books) -> None:
    async def scenario(w: World) -> None:
        held = await w.book.grant("c", ttl=60, selector=ANY, host=None)
        await w.book.grant("c", ttl=5, selector=ANY, host=None)
        w.clock.advance(5)
        assert await w.book.expire_due() == 1  # p1 is free again, p0 is not
        assert await grant_all(w) == ["p1"]
        assert (await w.book.renew(held.id, ttl=None)).proxy.name == "p0"

    books.run(simple_fleet(2), scenario)
