"""The status page's pieces without a browser: the query, the answer's totals,
filters and pages, the session cookie, grants per minute, the proxy detail."""

from __future__ import annotations

from typing import Any

import pytest

from discovery.fleet import FleetProxy
from discovery.leases import ProxyDetail, proxy_json
from discovery.metrics import RecentRate
from discovery.status import BadQuery, StatusQuery, fleet_status
from discovery.ui import Sessions

TOKEN = "page-token-" + "0123456789ab" * 3


def proxy(
    name: str,
    *,
    provider: str = "corp",
    zone: str | None = "z1",
    labels: dict[str, str] | None = None,
    health: str = "healthy",
    leased: bool = False,
    cooldowns: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "provider": provider,
        "type": "external",
        "zone": zone,
        "labels": labels or {},
        "health": health,
        "latencyMs": 1.0,
        "lastError": None,
        "leased": leased,
        "cooldowns": cooldowns or [],
        "lease": None,
        "recentMs": [],
    }


FLEET = [
    proxy("a", provider="kvm", labels={"site": "home"}),
    proxy("b", provider="kvm", zone="z2", health="unhealthy"),
    proxy("c", provider="gcp", zone=None, leased=True),
    proxy("d", health="unknown", cooldowns=[{"target": "x.example", "until": "..."}]),
]


def test_the_totals_count_the_whole_fleet_whatever_the_filter() -> None:
    answer = fleet_status(FLEET, StatusQuery(provider="kvm"), now=0.0, grants_last_minute=7)
    assert answer["totals"] == {
        "proxies": 4,
        "healthy": 2,
        "unhealthy": 1,
        "unknown": 1,
        "leased": 1,
        "cooling": 1,
        "grantsPerMinute": 7,
    }
    assert [p["name"] for p in answer["proxies"]] == ["a", "b"]
    assert answer["matching"] == 2 and answer["now"] == "1970-01-01T00:00:00.000Z"
    assert answer["filters"]["providers"] == ["corp", "gcp", "kvm"]
    assert answer["filters"]["zones"] == ["z1", "z2"]
    assert answer["filters"]["labels"] == ["site=home"]


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"zone": "z2"}, ["b"]),
        ({"label": "site=home"}, ["a"]),
        ({"state": "leased"}, ["c"]),
        ({"state": "free"}, ["a", "b", "d"]),
        ({"state": "cooling"}, ["d"]),
        ({"state": "unknown"}, ["d"]),
        ({"name": "C"}, ["c"]),
        ({"offset": "1", "limit": "2"}, ["b", "c"]),
        ({"offset": "9"}, []),
    ],
)
def test_filters_and_pages(params: dict[str, str], names: list[str]) -> None:
    answer = fleet_status(FLEET, StatusQuery.parse(params), now=0.0, grants_last_minute=0)
    assert [p["name"] for p in answer["proxies"]] == names


@pytest.mark.parametrize(
    "params",
    [
        {"label": "novalue"},
        {"label": "=v"},
        {"state": "asleep"},
        {"state": ""},
        {"limit": "0"},
        {"limit": "501"},
        {"offset": "-1"},
        {"offset": ""},
        {"offset": "²"},
        {"page": "2"},
    ],
)
def test_bad_queries_are_refused(params: dict[str, str]) -> None:
    with pytest.raises(BadQuery):
        StatusQuery.parse(params)


def test_ten_thousand_proxies_answer_one_page() -> None:
    fleet = [proxy(f"p{i}", zone=f"z{i % 4}") for i in range(10_000)]
    answer = fleet_status(fleet, StatusQuery.parse({}), now=0.0, grants_last_minute=0)
    assert len(answer["proxies"]) == 100 and answer["matching"] == 10_000


def test_a_session_cookie_is_not_the_token_expires_and_resists_tampering() -> None:
    now = [1000.0]
    sessions = Sessions(TOKEN, clock=lambda: now[0])
    cookie = sessions.new_cookie()
    assert TOKEN not in cookie and sessions.cookie_ok(cookie)
    expires, _, mac = cookie.partition(".")
    assert not sessions.cookie_ok(f"{int(expires) + 99999}.{mac}")
    assert not sessions.cookie_ok(cookie[:-1] + ("0" if cookie[-1] != "0" else "1"))
    assert not sessions.cookie_ok("") and not sessions.cookie_ok(None)
    assert not Sessions("another-token").cookie_ok(cookie)  # a new token ends every session
    now[0] += 13 * 3600
    assert not sessions.cookie_ok(cookie)
    assert sessions.token_ok(TOKEN) and not sessions.token_ok(TOKEN + "x")
    assert Sessions(None).required is False


def test_grants_per_minute_count_the_last_sixty_seconds() -> None:
    now = [100.0]
    rate = RecentRate(clock=lambda: now[0])
    rate.add()
    now[0] = 130.5
    rate.add(2)
    assert rate.total() == 3
    now[0] = 160.2
    assert rate.total() == 2
    now[0] = 500.0
    assert rate.total() == 0


def test_the_detail_shows_the_holder_and_never_the_password() -> None:
    fleet_proxy = FleetProxy(
        name="a",
        id="proxy-0123456789",
        provider="corp",
        type="external",
        zone=None,
        host="10.0.0.5",
        port=3128,
        labels={},
        username="crawler",
        password="s3cret-pw",
    )
    shown = proxy_json(
        fleet_proxy,
        health="unhealthy",
        latency_ms=None,
        last_error="denied: s3cret-pw",
        leased=True,
        cooldowns=[],
        detail=ProxyDetail(("bot@h:1", 0.0), (1.5, None)),
    )
    assert shown["lease"] == {"holder": "bot@h:1", "expiresAt": "1970-01-01T00:00:00.000Z"}
    assert shown["recentMs"] == [1.5, None]
    assert "s3cret-pw" not in repr(shown)
