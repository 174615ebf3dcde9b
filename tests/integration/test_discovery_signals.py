"""What the autopilot reads (`GET /v1/signals`, docs/discovery.md, "Signals
for the autopilot"), on both stores: first the book's counts (LeaseBook.signals)
on one fake clock through tests/support/lease_world.py, as the lease-rule
suite runs every contract operation; then the answer through the real HTTP
server."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.book.errors import NoProxyAvailable
from discovery.book.signals import MAX_WINDOW_S, SignalCounts
from discovery.database import PostgresUrl
from discovery.selection import Selector
from tests.support.discovery import ServerThread, proxy_entry, settings_for, wait_for, write_fleet
from tests.support.lease_world import STORES, Books, Clock, World, fleet_of
from tests.support.lease_world import books as books
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

ANY = Selector()
HOME = Selector(labels={"site": "home"})
EU = Selector(labels={"site": "eu"})
PASSWORD = "pw-of-the-proxy-9"
TOKEN = "signals-token-0123456789"


def at(seconds: float) -> object:
    """A time on the fake clock, to the millisecond (PostgreSQL keeps
    microseconds; the clock steps whole seconds). pytest.approx's default, a
    millionth of the epoch seconds, is half an hour: a block 100 s old would
    pass for one just now."""
    return pytest.approx(seconds, rel=0, abs=1e-3)


def fleet_entries() -> list[dict[str, Any]]:
    return [
        proxy_entry("home-0", port=4000, labels={"site": "home"}, username="c", password=PASSWORD),
        proxy_entry("home-1", port=4001, labels={"site": "home"}, username="c", password=PASSWORD),
        proxy_entry("eu-0", port=4002, labels={"site": "eu"}, username="c", password=PASSWORD),
    ]


def bans_of(counts: SignalCounts) -> dict[str, tuple[Any, ...]]:
    return {b.proxy: (b.sites, b.blocks, b.last_at) for b in counts.bans}


def refusals_of(counts: SignalCounts) -> dict[str, tuple[Any, ...]]:
    return {r.group: (r.refused, r.holders, r.first_at, r.last_at) for r in counts.refusals}


async def refused(w: World, holder: str, selector: Selector) -> str:
    with pytest.raises(NoProxyAvailable) as caught:
        await w.book.grant(holder, ttl=None, selector=selector, host=None)
    return caught.value.reason


# -- the book's counts, on one fake clock ---------------------------------------------------


def test_blocked_sites_are_counted_once_each_within_the_window(books: Books) -> None:
    async def scenario(w: World) -> None:
        lease = await w.book.grant("c", ttl=None, selector=HOME, host=None)
        for site in ("a.example", "b.example", "c.example", "a.example"):
            await w.book.report(lease.id, "blocked", host=site)
        await w.book.report(lease.id, "blocked", host=None)  # names no site
        await w.book.report(lease.id, "ok", host="d.example")  # no block
        w.clock.advance(100)
        await w.book.report(lease.id, "blocked", host="d.example")
        name = lease.proxy.name

        counts = await w.book.signals(600)
        assert counts.now == at(w.clock.now)
        assert bans_of(counts) == {name: (4, 6, at(w.clock.now))}
        # The first blocks are 100 s old: a window of 50 s holds only the last.
        assert bans_of(await w.book.signals(50)) == {name: (1, 1, at(w.clock.now))}
        assert bans_of(await w.book.signals(101)) == {name: (4, 6, at(w.clock.now))}
        w.clock.advance(601)
        assert bans_of(await w.book.signals(600)) == {}

    books.run(fleet_of(*fleet_entries()), scenario, max_ttl=3600)


def test_refused_grants_count_for_every_group_their_selector_matched(books: Books) -> None:
    async def scenario(w: World) -> None:
        first = w.clock.now
        await w.book.grant("h1", ttl=None, selector=EU, host=None)
        assert await refused(w, "h1", EU) == "leased"
        assert await refused(w, "h2", EU) == "leased"
        w.clock.advance(10)
        for _ in range(2):
            await w.book.grant("h1", ttl=None, selector=HOME, host=None)
        assert await refused(w, "h3", HOME) == "leased"
        # No selector: every proxy matches, so it is unmet demand of both groups.
        assert await refused(w, "h4", ANY) == "leased"
        # A selector no proxy matches is demand no group could meet.
        assert await refused(w, "h5", Selector(labels={"site": "mars"})) == "no_match"
        now = w.clock.now

        counts = await w.book.signals(600)
        assert refusals_of(counts) == {
            "eu": (3, 3, at(first), at(now)),
            "home": (2, 2, at(now), at(now)),
        }
        assert refusals_of(await w.book.signals(5)) == {
            "eu": (1, 1, at(now), at(now)),
            "home": (2, 2, at(now), at(now)),
        }
        w.clock.advance(601)
        assert refusals_of(await w.book.signals(600)) == {}

    books.run(fleet_of(*fleet_entries()), scenario, max_ttl=3600)


def test_refusals_survive_a_restart_and_are_pruned_past_the_longest_window(books: Books) -> None:
    clock = Clock()

    async def first(w: World) -> None:
        await w.book.grant("h1", ttl=None, selector=EU, host=None)
        await refused(w, "h2", EU)
        await w.book.signals(1)  # every refusal is written once this has answered

    async def second(w: World) -> None:
        assert refusals_of(await w.book.signals(600))["eu"][:2] == (1, 1)
        w.clock.advance(MAX_WINDOW_S + 1)
        await w.book.maintain()
        table = "refusals" if w.store == "sqlite" else "discovery_refusals"
        assert w.rows(f"SELECT count(*) FROM {table}") == [(0,)]

    fleet = fleet_of(*fleet_entries())
    books.run(fleet, first, clock=clock, max_ttl=3600)
    books.run(fleet, second, clock=clock, max_ttl=3600)


# -- through the HTTP server ------------------------------------------------------------------


@pytest.fixture(params=STORES)
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    db: Any = tmp_path / "leases.db"
    if request.param == "postgres":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db = PostgresUrl(pg.fresh_database(f"signals_http_{random.randrange(1 << 30)}"))
    settings = settings_for(tmp_path, db=db, token=TOKEN, max_lease_ttl=300)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, fleet_entries())
    with ServerThread(settings) as running:
        yield running


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=10, headers=headers) as client:
        wait_for(
            lambda: all(
                p["health"] == "healthy" for p in client.get("/v1/proxies").json()["proxies"]
            )
        )
        yield client


def signals(http: httpx.Client, window: int | None = None) -> dict[str, Any]:
    answer = http.get("/v1/signals", params={} if window is None else {"window": window})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def grant(http: httpx.Client, holder: str, labels: dict[str, str] | None) -> httpx.Response:
    body: dict[str, Any] = {"holder": holder}
    if labels is not None:
        body["selector"] = {"labels": labels}
    return http.post("/v1/leases", json=body)


def test_blocks_from_three_sites_show_three_and_drop_out_of_the_window(http: httpx.Client) -> None:
    lease = grant(http, "crawler-1", {"site": "eu"}).json()
    path = f"/v1/leases/{lease['id']}/report"
    for site in ("https://a.example/x", "b.example", "c.example:443", "a.example", "A.EXAMPLE"):
        assert http.post(path, json={"outcome": "blocked", "target": site}).status_code == 204

    body = signals(http)
    assert body["windowSeconds"] == 600
    assert [p["name"] for p in body["proxies"]] == ["home-0", "home-1", "eu-0"]
    eu = body["proxies"][2]
    assert (eu["group"], eu["blockedSites"], eu["blocks"], eu["leased"]) == ("eu", 3, 5, True)
    assert eu["lastBlockedAt"] is not None
    assert all(p["blockedSites"] == 0 and p["lastBlockedAt"] is None for p in body["proxies"][:2])
    time.sleep(2.1)  # the blocks are now over 2 s old: a 2 s window holds none
    assert signals(http, 2)["proxies"][2]["blockedSites"] == 0
    assert signals(http, 60)["proxies"][2]["blockedSites"] == 3


def test_refused_grants_raise_their_groups_unmet_count(http: httpx.Client) -> None:
    before = {g["name"]: g for g in signals(http)["groups"]}
    assert before == {
        name: {
            "name": name,
            "proxies": count,
            "healthy": count,
            "leased": 0,
            "refused": 0,
            "refusedHolders": 0,
            "firstRefusedAt": None,
            "lastRefusedAt": None,
        }
        for name, count in (("home", 2), ("eu", 1))
    }
    assert grant(http, "a", {"site": "eu"}).status_code == 201
    for holder in ("b", "c", "c"):
        assert grant(http, holder, {"site": "eu"}).status_code == 409
    assert grant(http, "d", {"site": "mars"}).status_code == 409  # matches no group

    groups = {g["name"]: g for g in signals(http)["groups"]}
    assert (groups["eu"]["refused"], groups["eu"]["refusedHolders"]) == (3, 2)
    assert (groups["eu"]["leased"], groups["eu"]["healthy"]) == (1, 1)
    assert groups["eu"]["firstRefusedAt"] <= groups["eu"]["lastRefusedAt"]
    assert (groups["home"]["refused"], groups["home"]["leased"]) == (0, 0)


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("window=0", "window: 0 "),
        ("window=86401", "window: 86401 "),
        ("window=-5", "window: '-5' "),
        ("window=1.5", "window: '1.5' "),
        ("window=abc", "window: 'abc' "),
        ("window=", "window: '' "),
        ("window=" + "9" * 5000, "window: '" + "9" * 24 + "...'"),
        ("window=60&window=60", "window: given more than once"),
        ("windw=60", "unknown parameter 'windw'"),
    ],
)
def test_a_bad_window_is_a_400_naming_it(http: httpx.Client, query: str, shown: str) -> None:
    answer = http.get(f"/v1/signals?{query}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "bad_request"
    assert answer.json()["detail"].startswith(shown), answer.json()["detail"]


def test_signals_need_the_token_and_show_no_secret(
    server: ServerThread, http: httpx.Client
) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        assert anonymous.get("/v1/signals").status_code == 401
    lease = grant(http, "holder-with-a-name", None).json()
    http.post(
        f"/v1/leases/{lease['id']}/report", json={"outcome": "blocked", "target": "s.example"}
    )
    grant(http, "another-holder", {"site": "eu"})
    grant(http, "another-holder", {"site": "eu"})
    text = http.get("/v1/signals").text
    for secret in (
        PASSWORD,
        TOKEN,
        lease["id"],
        "holder-with-a-name",
        "another-holder",
        "s.example",
    ):
        assert secret not in text
    assert "blockedSites" in text
