"""The status page's pieces without a browser: the query, the answer's totals,
filters and pages, the session cookie, grants per minute, the proxy detail;
and the real app in this process for what a client may send it."""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.book.views import ProxyDetail, proxy_json
from discovery.fleet import FleetProxy
from discovery.metrics import RecentRate
from discovery.status import BadQuery, StatusQuery, fleet_status
from discovery.ui import COOKIE, Sessions
from tests.support.discovery import app_client, proxy_entry, settings_for, write_fleet
from tests.support.logcapture import every_record

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


def test_the_probe_targets_in_order_with_the_down_ones_marked() -> None:
    targets = [("a.example:443", True), ("b.example:443", False)]
    answer = fleet_status(
        FLEET, StatusQuery(), now=0.0, grants_last_minute=0, probe_targets=targets
    )
    assert answer["probeTargets"] == [
        {"target": "a.example:443", "down": True},
        {"target": "b.example:443", "down": False},
    ]


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


# -- what a client may send the real app: 4xx, never a 500 or a traceback ------------------

BAD_COOKIES = [
    b"\xb2.abc",  # str.isdigit() takes "\u00b2", int() does not
    b"\xb2.0123456789abcdef." + b"0" * 64,
    b"5" * 5000 + b".0123456789abcdef." + b"0" * 64,  # past int()'s 4,300 digits
    b"9" * 40 + b".0123456789abcdef." + b"0" * 64,
    b"1.2.3",
    b"..",
    b"\xff\xfe",
]


def served(tmp_path: Path) -> Any:
    settings = settings_for(tmp_path, token=TOKEN)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("a")])
    return app_client(settings)


def no_traceback(records: list[str]) -> None:
    assert not [r for r in records if "Traceback" in r or "unhandled" in r], records


@pytest.mark.parametrize("cookie", BAD_COOKIES)
def test_a_forged_cookie_is_refused_without_a_traceback(tmp_path: Path, cookie: bytes) -> None:
    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            header = {"cookie": b"discovery_session=" + cookie}
            page = await http.get("/ui/", headers=header)
            assert page.status_code == 401 and 'id="token"' in page.text
            data = await http.get("/ui/api/status", headers=header)
            assert data.status_code == 401
            assert data.json() == {"error": "unauthorized", "detail": "log in first"}
            logout = await http.post("/ui/logout", headers=header)
            assert logout.status_code == 303

    with every_record() as records:
        asyncio.run(scenario())
    no_traceback(records)


def test_a_login_form_with_too_many_fields_is_a_400(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            form = "&".join([f"token={TOKEN}", "a=1", "b=2", "c=3", "d=4"])
            answer = await http.post(
                "/ui/login",
                content=form,
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert answer.status_code == 400 and "text/html" in answer.headers["content-type"]
            assert "more than 4 fields" in answer.text
            assert COOKIE not in answer.headers.get("set-cookie", "")

    with every_record() as records:
        asyncio.run(scenario())
    no_traceback(records)


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ("offset=" + "5" * 5000, "offset: '55555"),
        ("offset=" + "0" * 20 + "7", None),
        ("limit=" + "9" * 5000, "limit: '99999"),
        ("offset=%C2%B2", "offset: '\u00b2' is not a whole number from 0 to"),
        ("offset=1000000001", "offset: 1000000001 is not a whole number from 0 to 1000000000"),
    ],
)
def test_a_huge_or_odd_number_in_the_query_is_a_400(
    tmp_path: Path, query: str, detail: str | None
) -> None:
    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            answer = await http.get(
                f"/ui/api/status?{query}", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            if detail is None:  # leading zeros: a small number after all
                assert answer.status_code == 200 and answer.json()["offset"] == 7
                return
            assert answer.status_code == 400, answer.text
            body = answer.json()
            assert body["error"] == "bad_request" and body["detail"].startswith(detail)
            assert len(body["detail"]) < 200

    with every_record() as records:
        asyncio.run(scenario())
    no_traceback(records)


def test_logging_out_revokes_the_cookie(tmp_path: Path) -> None:
    async def log_in(http: httpx.AsyncClient) -> str:
        answer = await http.post("/ui/login", data={"token": TOKEN})
        assert answer.status_code == 303
        return answer.cookies[COOKIE]

    async def opens(http: httpx.AsyncClient, cookie: str) -> bool:
        answer = await http.get("/ui/", headers={"cookie": f"{COOKIE}={cookie}"})
        return answer.status_code == 200

    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            ended, other = await log_in(http), await log_in(http)
            assert ended != other  # two sessions, even in one second
            assert await opens(http, ended) and await opens(http, other)
            http.cookies.clear()
            out = await http.post("/ui/logout", headers={"cookie": f"{COOKIE}={ended}"})
            assert out.status_code == 303
            assert not await opens(http, ended)  # a copy kept by anyone opens nothing
            data = await http.get("/ui/api/status", headers={"cookie": f"{COOKIE}={ended}"})
            assert data.status_code == 401
            assert await opens(http, other)  # the other session goes on

    asyncio.run(scenario())


def test_revoked_cookies_are_kept_until_they_expire_and_bounded() -> None:
    now = [1000.0]
    sessions = Sessions(TOKEN, clock=lambda: now[0], max_revoked=3)
    first = sessions.new_cookie()
    sessions.revoke(first)
    sessions.revoke(first)  # once is enough
    assert not sessions.cookie_ok(first) and len(sessions._revoked) == 1
    sessions.revoke("1.2.3")  # not a cookie of ours: nothing kept
    sessions.revoke(None)
    assert len(sessions._revoked) == 1
    later = []
    for _ in range(4):
        now[0] += 10
        later.append(sessions.new_cookie())
        sessions.revoke(later[-1])
    assert len(sessions._revoked) == 3  # the bound: the first to expire went first
    assert not any(sessions.cookie_ok(c) for c in later[1:])
    now[0] += 13 * 3600  # all expired: the next revocation drops them
    sessions.revoke(sessions.new_cookie())
    assert len(sessions._revoked) == 1


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Basic {TOKEN}", TOKEN],
    ids=["longer", "shorter", "empty", "other-scheme", "no-scheme"],
)
def test_the_page_data_needs_the_very_token(tmp_path: Path, authorization: str) -> None:
    """Any other Authorization header than `Bearer <token>` is refused, by the
    page's data endpoint and by its login form alike; the token itself opens both."""

    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            refused = await http.get("/ui/api/status", headers={"Authorization": authorization})
            assert refused.status_code == 401, refused.text
            right = await http.get("/ui/api/status", headers={"Authorization": f"Bearer {TOKEN}"})
            assert right.status_code == 200 and right.json()["totals"]["proxies"] == 1
            given = authorization.rpartition(" ")[2]
            if given != TOKEN:
                login = await http.post("/ui/login", data={"token": given})
                assert COOKIE not in login.cookies

    asyncio.run(scenario())


def test_tokens_are_compared_in_constant_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's bearer token and the page's: through hmac.compare_digest, on
    digests of equal length (not even the token's length leaks)."""
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)

    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            wrong = {"Authorization": "Bearer wrong"}
            assert (await http.get("/v1/proxies", headers=wrong)).status_code == 401
            assert (await http.get("/ui/api/status", headers=wrong)).status_code == 401

    asyncio.run(scenario())
    assert len(compared) >= 2 and set(compared) == {(32, 32)}
