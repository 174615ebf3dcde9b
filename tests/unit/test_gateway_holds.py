"""The gateway's username syntax and admission, and its holds (sessions, site
sets, idle release, renewal, bans) over a fake lease book and a controlled
clock: what the integration tests show through real programs, here rule by
rule and without waiting."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from typing import Any

import pytest

from discovery.book.contract import Lease
from discovery.brake import Brake
from discovery.gateway.holds import HolderLimit, Holds
from discovery.gateway.identity import (
    ANONYMOUS,
    Admission,
    BadUsername,
    Identity,
    Refusal,
    parse_username,
)
from discovery.selection import Selector
from tests.support.gateway_book import FakeBook, run

TOKEN = "gateway-token-0123456789abcdef"


# -- the username -----------------------------------------------------------------------------


def test_a_username_names_the_holder_its_session_and_a_selector() -> None:
    got = parse_username("crawler-7-session-a1b2-zone-us-east1-b-label-site=home-label-tier=2")
    assert got.holder == "crawler-7"
    assert got.session == "a1b2"
    assert got.selector == Selector(None, "us-east1-b", {"site": "home", "tier": "2"})
    assert got.describe() == "crawler-7-session-a1b2"
    assert parse_username("crawler7") == Identity("crawler7")


@pytest.mark.parametrize(
    ("username", "part"),
    [
        ("", "holder"),
        ("-session-a", "holder"),
        ("c-session-", "-session-"),
        ("c-session-a-session-b", "twice"),
        ("c-label-novalue", "KEY=VALUE"),
        ("c-session-a/b", "session id"),
        ("c" * 129, "holder"),
    ],
)
def test_a_bad_username_is_refused_naming_the_part(username: str, part: str) -> None:
    with pytest.raises(BadUsername, match=part):
        parse_username(username)


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def test_admission_checks_the_token_brakes_guessing_and_admits_allowed_addresses() -> None:
    now = [0.0]
    brake = Brake(free_failures=2, clock=lambda: now[0])
    allowed = Admission(TOKEN, brake, [ipaddress.ip_network("10.1.0.0/16")])
    assert allowed.admit(basic("c-session-s", TOKEN), "192.0.2.1") == Identity("c", "s")
    assert allowed.admit(None, "10.1.2.3") == Identity("address-10.1.2.3", "10.1.2.3")
    refused = allowed.admit(None, "192.0.2.1")
    assert isinstance(refused, Refusal) and (refused.status, refused.reason) == (
        407,
        "auth_required",
    )
    for _ in range(2):
        wrong = allowed.admit(basic("c", "wrong"), "192.0.2.9")
        assert isinstance(wrong, Refusal) and wrong.reason == "wrong_token"
    braked = allowed.admit(basic("c", TOKEN), "192.0.2.9")  # even the right token waits
    assert isinstance(braked, Refusal) and braked.status == 429 and braked.retry_after == 1
    now[0] += 2
    assert allowed.admit(basic("c", TOKEN), "192.0.2.9") == Identity("c")
    not_basic = allowed.admit(b"Bearer " + TOKEN.encode(), "192.0.2.1")
    assert isinstance(not_basic, Refusal) and not_basic.status == 407
    bad = allowed.admit(basic("c-session-", TOKEN), "192.0.2.1")
    assert isinstance(bad, Refusal) and bad.status == 400
    # A service without a token (loopback only): anyone, the password unchecked.
    assert Admission(None, Brake()).admit(None, "127.0.0.1") == Identity(ANONYMOUS)
    assert Admission(None, Brake()).admit(basic("c", "x"), "127.0.0.1") == Identity("c")


# -- holds --------------------------------------------------------------------------------------


SESSION = Identity("c", "s")
SITES = Identity("c")


def test_a_session_keeps_its_proxy_across_sites_until_it_cools_down_for_one() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        first = await holds.acquire(SESSION, "a.example")
        holds.done(first)
        again = await holds.acquire(SESSION, "b.example")
        holds.done(again)
        assert again is first
        book.cooling_for.add((first.proxy, "c.example"))  # from before the session had it
        moved = await holds.acquire(SESSION, "c.example")
        assert moved.proxy != first.proxy
        assert f"release {first.lease.id}" in book.calls

    run(scenario)


def test_a_site_set_grows_to_per_site_then_shares_the_least_busy() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        got = [await holds.acquire(SITES, "a.example") for _ in range(3)]
        assert [h.proxy for h in got] == ["p0", "p1", "p0"]  # per_site=2: then shared
        holds.done(got[0])
        assert (await holds.acquire(SITES, "a.example")).proxy == "p0"  # a free one first

    run(scenario, per_site=2)


def test_idle_holds_are_released_and_busy_ones_renewed() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        idle = await holds.acquire(Identity("c", "idle"), "a.example")
        busy = await holds.acquire(Identity("c", "busy"), "a.example")
        holds.done(idle)
        now[0] += 40  # past half the TTL, past the idle time
        await holds.tick()
        assert f"release {idle.lease.id}" in book.calls
        assert f"renew {busy.lease.id}" in book.calls
        assert busy.lease.expires_at == now[0] + 60
        assert holds.every() == [busy]

    run(scenario, idle_release=30.0)


def test_a_ban_moves_the_hold_and_its_lease_is_released_once_unused() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        hold = await holds.acquire(SESSION, "a.example")
        await holds.report(hold, "blocked", "a.example")
        assert f"release {hold.lease.id}" not in book.calls  # still in use
        other = await holds.acquire(SESSION, "a.example")
        assert other.proxy != hold.proxy
        holds.done(hold)
        await asyncio.sleep(0)
        assert f"release {hold.lease.id}" in book.calls

    run(scenario)


def test_a_holder_holds_at_most_its_leases_and_concurrent_asks_share_one_grant() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        together = await asyncio.gather(*(holds.acquire(SESSION, "a.example") for _ in range(5)))
        assert len({h.proxy for h in together}) == 1
        assert sum(call.startswith("grant") for call in book.calls) == 1
        await holds.acquire(Identity("c", "two"), "a.example")
        with pytest.raises(HolderLimit):
            await holds.acquire(Identity("c", "three"), "a.example")
        assert (await holds.acquire(Identity("other", "x"), "a.example")).proxy == "p2"

    run(scenario, holder_leases=2)


def test_a_lease_lost_closes_its_tunnels() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        hold = await holds.acquire(SESSION, "a.example")
        closed: list[str] = []
        hold.closers.add(lambda: closed.append("tunnel"))
        del book.leased[hold.lease.id]  # the proxy left the fleet
        now[0] += 40
        await holds.tick()
        assert closed == ["tunnel"]
        assert holds.every() == []

    run(scenario)


def test_close_releases_every_lease() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        for session in ("a", "b"):
            await holds.acquire(Identity("c", session), "a.example")
        await holds.close()
        assert book.leased == {}

    run(scenario)


def test_a_client_gone_during_its_grant_leaves_a_hold_the_upkeep_releases() -> None:
    async def scenario(book: FakeBook, holds: Holds, now: list[float]) -> None:
        gate = asyncio.Event()
        grant = book.grant

        async def slow_grant(holder: str, **kwargs: Any) -> Lease:
            await gate.wait()
            return await grant(holder, **kwargs)

        book.grant = slow_grant  # type: ignore[method-assign]
        asker = asyncio.create_task(holds.acquire(SESSION, "a.example"))
        await asyncio.sleep(0)
        asker.cancel()  # the client went away while its lease was being granted
        gate.set()
        await asyncio.sleep(0.01)
        [hold] = holds.every()  # the lease the book granted is known, not lost
        assert hold.in_use == 0
        now[0] += 61
        await holds.tick()
        assert book.leased == {}

    run(scenario)
