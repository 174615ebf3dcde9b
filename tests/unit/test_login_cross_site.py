"""Which POSTs to the status page's forms are another site's (discovery/ui.py,
`cross_site`; issue 39, finding 2): an `Origin` that is not the service's
own (scheme and Host as the request reached it, default ports filled in), or
`Sec-Fetch-Site: cross-site`; then the real app in this process: a 403 page
that names the header, escaped, and counts no guess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from starlette.requests import Request

from discovery.ui import COOKIE, cross_site
from tests.support.discovery import app_client, proxy_entry, settings_for, write_fleet

TOKEN = "origin-token-" + "a1b2c3d4e5f6" * 3


def post(headers: dict[str, str], scheme: str = "http") -> Request:
    return Request(
        {
            "type": "http",
            "method": "POST",
            "scheme": scheme,
            "server": ("127.0.0.1", 8080),
            "path": "/ui/login",
            "root_path": "",
            "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
    )


@pytest.mark.parametrize(
    ("scheme", "headers"),
    [
        ("http", {}),  # curl, a script
        ("http", {"Host": "d.example", "Origin": "http://d.example"}),
        ("http", {"Host": "d.example:80", "Origin": "http://d.example"}),
        ("https", {"Host": "d.example", "Origin": "https://d.example:443"}),
        ("http", {"Host": "D.Example:8080", "Origin": "http://d.example:8080"}),
        ("http", {"Host": "[::1]:8080", "Origin": "http://[::1]:8080"}),
        ("http", {"Origin": "http://127.0.0.1:8080"}),  # no Host: the socket's address
        ("http", {"Host": "d.example", "Sec-Fetch-Site": "same-origin"}),
        ("http", {"Host": "d.example", "Sec-Fetch-Site": "none"}),  # typed, a bookmark
        # Chromium's own post from a page with Referrer-Policy: no-referrer:
        # the browser's Sec-Fetch-Site decides.
        ("http", {"Host": "d.example", "Origin": "null", "Sec-Fetch-Site": "same-origin"}),
    ],
)
def test_a_post_from_the_page_itself_or_no_browser_is_taken(
    scheme: str, headers: dict[str, str]
) -> None:
    assert cross_site(post(headers, scheme)) is None


@pytest.mark.parametrize(
    ("scheme", "headers", "named"),
    [
        (
            "http",
            {"Host": "d.example", "Origin": "https://evil.example"},
            "Origin: https://evil.example",
        ),
        ("http", {"Host": "d.example", "Origin": "null"}, "Origin: null"),
        (
            "http",
            {"Host": "d.example", "Origin": "http://d.example:8080"},
            "Origin: http://d.example:8080",
        ),
        ("http", {"Host": "d.example", "Origin": "https://d.example"}, "Origin: https://d.example"),
        ("https", {"Host": "d.example", "Origin": "http://d.example"}, "Origin: http://d.example"),
        (
            "http",
            {"Host": "d.example", "Origin": "http://d.example:99999"},
            "Origin: http://d.example:99999",
        ),
        ("http", {"Host": "d.example", "Origin": "ftp://d.example"}, "Origin: ftp://d.example"),
        (
            "http",
            {"Host": "d.example", "Sec-Fetch-Site": "Cross-Site"},
            "Sec-Fetch-Site: Cross-Site",
        ),
        (
            "http",
            {"Host": "d.example", "Sec-Fetch-Site": "same-site"},  # a sibling subdomain's page
            "Sec-Fetch-Site: same-site",
        ),
        (
            "http",
            {"Host": "d.example", "Origin": "http://d.example", "Sec-Fetch-Site": "cross-site"},
            "Sec-Fetch-Site: cross-site",
        ),
        (
            "http",
            {"Host": "d.example", "Origin": "http://" + "x" * 300},
            "Origin: http://" + "x" * 93,
        ),
    ],
)
def test_a_post_from_another_site_names_the_header(
    scheme: str, headers: dict[str, str], named: str
) -> None:
    assert cross_site(post(headers, scheme)) == named


def test_the_refusal_is_a_403_page_escaping_what_it_names(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, token=TOKEN)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("a")])

    async def scenario() -> None:
        async with app_client(settings) as (http, service):
            origin = {"Origin": 'https://evil.example"><script>alert(1)</script>'}
            for _ in range(10):
                answer = await http.post("/ui/login", data={"token": "x" * 20}, headers=origin)
                assert answer.status_code == 403 and COOKIE not in answer.cookies
            assert "&lt;script&gt;" in answer.text and "<script>alert" not in answer.text
            assert "text/html" in answer.headers["content-type"]
            assert answer.headers["content-security-policy"].startswith("default-src 'none'")
            logout = await http.post("/ui/logout", headers=origin)
            assert logout.status_code == 403
            # No guess was counted (ten would have closed the form), none on
            # the API's brake either.
            same = {"Origin": "http://discovery"}  # the client's base URL: the Host it sends
            answer = await http.post("/ui/login", data={"token": TOKEN}, headers=same)
            assert answer.status_code == 303 and COOKIE in answer.cookies
            assert len(service.brake) == 0

    asyncio.run(scenario())
