"""The gateway's holds when the fleet changes (Holds.fleet_changed, called by
the service before its book switches), rule by rule over the fake book of
tests/support/gateway_book.py, which plays a book that has not switched yet: it
still grants and renews the departed proxies. The same through the real
service and squids: tests/integration/test_gateway_fleet_change.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from discovery.book.errors import NoProxyAvailable
from discovery.fleet import FleetProxy
from discovery.gateway.holds import Holds
from discovery.gateway.identity import Identity
from tests.support.gateway_book import FakeBook, run


def fleet(*names: str) -> dict[str, FleetProxy]:
    return {n: FleetProxy(n, n, "kvm", "kvm", None, "127.0.0.1", 3128, {}) for n in names}


SESSION = Identity("c", "s")
SITES = Identity("c")


def test_holds_on_a_departed_proxy_leave_at_once_and_the_next_request_gets_another() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        session = await holds.acquire(SESSION, "a.example")
        site_set = await holds.acquire(SITES, "a.example")
        assert (session.proxy, site_set.proxy) == ("p0", "p1")
        holds.done(session)
        holds.done(site_set)
        left = holds.fleet_changed(fleet("p1", "p2", "p3"))  # p0 recycled
        assert left == [session]
        assert holds.every() == [site_set]
        await asyncio.sleep(0)
        assert f"release {session.lease.id}" in book.calls  # given back, unused
        # The book has not switched yet and grants p0 first: held aside, not used.
        again = await holds.acquire(SESSION, "a.example")
        assert again.proxy == "p2"
        grants = [c for c in book.calls if c.startswith("grant")]
        assert grants[-2:] == ["grant c-session-s a.example"] * 2
        assert {lease.proxy.name for lease in book.leased.values()} == {"p1", "p2"}
        assert (await holds.acquire(SITES, "a.example")) is site_set  # its proxy stays

    run(scenario, proxies=4)


def test_a_tunnel_through_a_departed_proxy_may_finish_and_its_lease_goes_after() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        hold = await holds.acquire(SESSION, "a.example")  # a tunnel's: in use
        closed: list[str] = []
        hold.closers.add(lambda: closed.append("tunnel"))
        holds.fleet_changed(fleet("p1", "p2"))
        assert closed == [] and hold.lease.id in book.leased
        assert (await holds.acquire(SESSION, "a.example")).proxy == "p1"
        now[0] += 40  # the upkeep renews the new hold only
        await holds.tick()
        assert f"renew {hold.lease.id}" not in book.calls
        holds.done(hold)  # the tunnel ends
        await asyncio.sleep(0)
        assert f"release {hold.lease.id}" in book.calls and closed == []

    run(scenario)


def test_a_proxy_that_moved_is_used_at_its_new_address_even_if_the_book_renews_the_old() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        hold = await holds.acquire(SESSION, "a.example")
        holds.done(hold)
        moved = fleet("p0", "p1")
        moved["p0"] = replace(moved["p0"], host="127.0.0.9", port=3129)
        assert holds.fleet_changed(moved) == []
        assert (hold.lease.proxy.host, hold.lease.proxy.port) == ("127.0.0.9", 3129)
        now[0] += 40
        await holds.tick()  # the unswitched book answers with the old address
        assert f"renew {hold.lease.id}" in book.calls
        assert (hold.lease.proxy.host, hold.lease.proxy.port) == ("127.0.0.9", 3129)
        assert (await holds.acquire(SESSION, "a.example")) is hold

    run(scenario)


def test_a_book_left_with_only_departed_proxies_refuses_and_keeps_none_of_them() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        holds.fleet_changed(fleet("p9"))  # every proxy the book grants left
        with pytest.raises(NoProxyAvailable):
            await holds.acquire(SESSION, "a.example")
        assert book.leased == {}
        assert holds.every() == []

    run(scenario, proxies=2)
