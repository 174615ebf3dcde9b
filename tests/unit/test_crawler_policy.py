"""Ban detection (egress_proxies_client.BanPolicy), sites, and how the Scrapy
middleware reads its policy and settings."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

from egress_proxies_client._bans import BanPolicy, needs_body, site_of, target_of
from egress_proxies_client.scrapy import DiscoveryProxyMiddleware, ban_policy
from tests.support.programs import ROOT

NO_HEADERS: dict[str, str] = {}


@pytest.mark.parametrize("status", [403, 429, 503])
def test_the_default_policy_bans_403_429_503(status: int) -> None:
    assert BanPolicy().is_ban(status, NO_HEADERS, b"")


@pytest.mark.parametrize("status", [200, 201, 301, 404, 407, 500, 502])
def test_the_default_policy_lets_other_answers_through(status: int) -> None:
    assert not BanPolicy().is_ban(status, NO_HEADERS, b"<p>please solve this captcha</p>")


@pytest.mark.parametrize(
    "pattern",
    ["solve this captcha", b"solve this captcha", re.compile(b"solve\\s+this\\s+captcha")],
)
def test_a_body_pattern_bans_a_200_that_matches(pattern: str | bytes | re.Pattern[bytes]) -> None:
    policy = BanPolicy(body_pattern=pattern)
    assert policy.is_ban(200, NO_HEADERS, b"<p>Please solve this captcha</p>")
    assert not policy.is_ban(200, NO_HEADERS, b"<p>the page you wanted</p>")
    assert policy.is_ban(403, NO_HEADERS, b"")  # statuses still count
    assert policy.needs_body


def test_statuses_can_be_replaced() -> None:
    policy = BanPolicy(statuses=[418])
    assert policy.is_ban(418, NO_HEADERS, b"")
    assert not policy.is_ban(403, NO_HEADERS, b"")
    assert not BanPolicy(statuses=()).is_ban(503, NO_HEADERS, b"")


def test_an_empty_pattern_matches_nothing_and_needs_no_body() -> None:
    assert not BanPolicy().needs_body
    assert not BanPolicy(body_pattern="").needs_body
    assert not BanPolicy(body_pattern="").is_ban(200, NO_HEADERS, b"anything")


def test_a_subclass_may_look_at_headers() -> None:
    class Challenge(BanPolicy):
        def is_ban(self, status: int, headers: Any, body: bytes) -> bool:
            return headers.get("cf-mitigated") == "challenge" or super().is_ban(
                status, headers, body
            )

    headers = httpx.Headers({"CF-Mitigated": "challenge"})
    assert Challenge().is_ban(200, headers, b"")
    assert not Challenge().is_ban(200, httpx.Headers(), b"")


def test_a_policy_that_does_not_say_is_assumed_to_need_the_body() -> None:
    class Plain:
        def is_ban(self, status: int, headers: Any, body: bytes) -> bool:
            return False

    assert needs_body(Plain())
    assert not needs_body(BanPolicy())


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("https://Shop.Example/a?b#c", "shop.example"),
        ("http://shop.example:8080/", "shop.example"),
        ("http://user:pw@shop.example./", "shop.example"),
        ("http://127.0.0.1:3128/page/1", "127.0.0.1"),
        ("http://[2001:DB8::1]:8080/", "2001:db8::1"),
        (httpx.URL("https://WWW.example.org/x"), "www.example.org"),
    ],
)
def test_the_site_of_a_url_is_its_host_name(url: str | httpx.URL, site: str) -> None:
    assert site_of(url) == site


def test_a_url_without_a_host_has_no_site() -> None:
    with pytest.raises(ValueError, match="no host name"):
        site_of("file:///etc/passwd")


def test_an_ipv6_site_goes_to_the_service_in_brackets() -> None:
    assert target_of("2001:db8::1") == "[2001:db8::1]"
    assert target_of("shop.example") == "shop.example"


# -- Scrapy settings -------------------------------------------------------------------------


def crawler(**settings: Any) -> Crawler:
    # What ban_policy() and from_crawler() read before the crawl starts.
    fake = SimpleNamespace(settings=Settings(settings), stats=None, spidercls=None)
    return cast(Crawler, fake)


def test_scrapy_default_policy_from_settings() -> None:
    policy = ban_policy(crawler())
    assert isinstance(policy, BanPolicy)
    assert policy.statuses == {403, 429, 503}
    assert policy.body_pattern is None


def test_scrapy_statuses_and_body_from_settings_as_the_command_line_gives_them() -> None:
    # `scrapy crawl -s DISCOVERY_BAN_STATUSES=403,418 -s DISCOVERY_BAN_BODY=captcha`
    policy = ban_policy(
        crawler(DISCOVERY_BAN_STATUSES="403,418", DISCOVERY_BAN_BODY="are you a robot")
    )
    assert isinstance(policy, BanPolicy)
    assert policy.statuses == {403, 418}
    assert policy.is_ban(200, NO_HEADERS, b"<h1>So, are you a robot?</h1>")


class FromCrawler:
    def __init__(self, word: str) -> None:
        self.word = word.encode()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FromCrawler:
        return cls(crawler.settings.get("MY_WORD"))

    def is_ban(self, status: int, headers: Any, body: bytes) -> bool:
        return self.word in body


class Plain:
    def is_ban(self, status: int, headers: Any, body: bytes) -> bool:
        return status == 451


def test_scrapy_policy_replaced_by_import_path_class_or_instance() -> None:
    by_path = ban_policy(crawler(DISCOVERY_BAN_POLICY=f"{__name__}.FromCrawler", MY_WORD="blocked"))
    assert isinstance(by_path, FromCrawler) and by_path.word == b"blocked"
    assert isinstance(ban_policy(crawler(DISCOVERY_BAN_POLICY=Plain)), Plain)
    instance = BanPolicy(statuses=[999])
    assert ban_policy(crawler(DISCOVERY_BAN_POLICY=instance)) is instance


def test_scrapy_policy_without_is_ban_is_refused() -> None:
    with pytest.raises(TypeError, match="is_ban"):
        ban_policy(crawler(DISCOVERY_BAN_POLICY="collections.OrderedDict"))


def test_the_middleware_without_a_service_url_stops_the_crawl_rather_than_go_direct() -> None:
    with pytest.raises(ValueError, match="DISCOVERY_URL is not set"):
        DiscoveryProxyMiddleware.from_crawler(crawler())


def test_the_middleware_can_be_switched_off_explicitly() -> None:
    with pytest.raises(NotConfigured):
        DiscoveryProxyMiddleware.from_crawler(crawler(DISCOVERY_ENABLED=False))


def test_the_core_never_loads_scrapy() -> None:
    # The import contract (pyproject.toml) in one process: the service, the
    # client and the httpx transports start without Scrapy or Twisted.
    code = (
        "import sys, discovery.app, discovery.cli, egress_proxies_client, health.engine, "
        "proxyinfra.program; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scrapy', 'twisted')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
