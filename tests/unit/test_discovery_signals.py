"""The signals' rules without a store: the window's bounds, the group a
proxy belongs to, and the answer built from a store's counts and the fleet."""

from __future__ import annotations

from typing import Any

import pytest

from discovery.book.signals import BanCount, RefusalCount, SignalCounts, group_of, groups_of
from discovery.signals import BadSignalsQuery, build, parse_window

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("params", "window"),
    [
        ({}, 600.0),
        ({"window": ["1"]}, 1.0),
        ({"window": ["86400"]}, 86400.0),
        ({"window": ["0060"]}, 60.0),
    ],
)
def test_a_window_is_whole_seconds_from_1_to_86400(params: Any, window: float) -> None:
    assert parse_window(params) == window


@pytest.mark.parametrize(
    ("params", "detail"),
    [
        ({"window": ["0"]}, "window: 0 is not a whole number of seconds from 1 to 86400"),
        ({"window": ["86401"]}, "window: 86401 is not"),
        ({"window": ["1e3"]}, "window: '1e3' is not"),
        ({"window": ["²"]}, "window: '²' is not"),
        ({"window": [" 60"]}, "window: ' 60' is not"),
        ({"window": ["1", "2"]}, "window: given more than once"),
        ({"since": ["1"]}, "unknown parameter 'since'; only window is known"),
    ],
)
def test_a_bad_window_names_the_parameter(params: Any, detail: str) -> None:
    with pytest.raises(BadSignalsQuery) as caught:
        parse_window(params)
    assert str(caught.value).startswith(detail)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("home-0", "home"),
        ("home-eu-12", "home-eu"),
        ("shop", "shop"),  # an external entry's one proxy
        ("web-", "web-"),
        ("-3", "-3"),
        ("a-b", "a-b"),
        ("edge-1-2", "edge-1"),
    ],
)
def test_a_proxys_group_is_its_name_without_the_replica_number(name: str, group: str) -> None:
    assert group_of(name) == group


def test_groups_are_distinct_and_sorted() -> None:
    assert groups_of(["b-1", "a-0", "b-0", "a"]) == ["a", "b"]


def row(name: str, health: str = "healthy", leased: bool = False) -> dict[str, Any]:
    return {"name": name, "health": health, "leased": leased, "labels": {}, "cooldowns": []}


def test_the_answer_holds_every_proxy_and_group_of_the_fleet_and_nothing_else() -> None:
    counts = SignalCounts(
        NOW,
        600.0,
        bans=[BanCount("home-1", 3, 4, NOW - 1), BanCount("gone-0", 9, 9, NOW)],
        refusals=[
            RefusalCount("eu", 5, 2, NOW - 30, NOW - 2),
            RefusalCount("gone", 1, 1, NOW, NOW),
        ],
    )
    fleet = [row("home-0"), row("home-1", leased=True), row("eu-0", health="unhealthy")]
    assert build(counts, fleet) == {
        "now": "2027-01-15T08:00:00.000Z",
        "windowSeconds": 600,
        "proxies": [
            {
                "name": "home-0",
                "group": "home",
                "health": "healthy",
                "leased": False,
                "blockedSites": 0,
                "blocks": 0,
                "lastBlockedAt": None,
            },
            {
                "name": "home-1",
                "group": "home",
                "health": "healthy",
                "leased": True,
                "blockedSites": 3,
                "blocks": 4,
                "lastBlockedAt": "2027-01-15T07:59:59.000Z",
            },
            {
                "name": "eu-0",
                "group": "eu",
                "health": "unhealthy",
                "leased": False,
                "blockedSites": 0,
                "blocks": 0,
                "lastBlockedAt": None,
            },
        ],
        "groups": [
            {
                "name": "home",
                "proxies": 2,
                "healthy": 2,
                "leased": 1,
                "refused": 0,
                "refusedHolders": 0,
                "firstRefusedAt": None,
                "lastRefusedAt": None,
            },
            {
                "name": "eu",
                "proxies": 1,
                "healthy": 0,
                "leased": 0,
                "refused": 5,
                "refusedHolders": 2,
                "firstRefusedAt": "2027-01-15T07:59:30.000Z",
                "lastRefusedAt": "2027-01-15T07:59:58.000Z",
            },
        ],
    }
