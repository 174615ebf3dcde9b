"""Crawls through leased proxies, as crawler authors run them, with the
crawler client installed as they install it (its wheel, `pip install`ed into
a virtualenv of its own: tests/support/client_venv.py): a Scrapy spider
(`python -m scrapy runspider`) with egress_proxies_client.scrapy's
middleware, and the httpx transports (sync and async, tests/support/
httpx_crawl.py), each run by that environment's Python, through three real
squids listed as `external` proxies, with the real discovery service
handing them out.

The site bans each proxy's address after LIMIT pages, and the crawl needs
PAGES > 2 * LIMIT of them: it completes only if the crawler rotates onto
every one of the three proxies. What each test proves: every page fetched
once, none directly; a banned proxy is used only a few more times (the
requests already in flight) and shows a cooldown for the site; no lease is
held when the crawler is done.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.client_venv import ClientVenv
from tests.support.crawlsite import (
    PASSWORD,
    TOKEN,
    BanningSite,
    Proxy,
    client,
    crawl_service,
    start_proxies,
)
from tests.support.discovery import ROOT, ServiceProcess, proxies

pytestmark = pytest.mark.integration

LIMIT = 15  # pages the site gives one address
PAGES = 40  # more than two proxies are allowed: a crawl needs the third
IN_FLIGHT = 8  # concurrent requests per site (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN)
CAPTCHA = b"<html><p>Please solve this captcha to continue</p></html>\n"
SPIDER = ROOT / "tests" / "support" / "crawl_spider.py"
HTTPX_CRAWL = ROOT / "tests" / "support" / "httpx_crawl.py"


@pytest.fixture(scope="module")
def squids() -> Iterator[list[Proxy]]:
    with start_proxies(3) as running:
        yield running


def banning_site(squids: list[Proxy], ban: tuple[int, bytes] = (403, b"banned\n")) -> BanningSite:
    """The site; `ban` is its answer to a banned proxy."""
    return BanningSite(LIMIT, ban_answers={p.address: ban for p in squids}, delay=0.02)


# -- Scrapy ----------------------------------------------------------------------------------


def run_spider(
    venv: ClientVenv,
    tmp_path: Path,
    service: ServiceProcess,
    site: BanningSite,
    *,
    pages: int,
    settings: dict[str, str],
    args: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], dict[str, Any], float]:
    """(the finished process, items, Scrapy's stats, seconds)."""
    items = tmp_path / "items.jsonl"
    stats = tmp_path / "stats.json"
    command = ["-m", "scrapy", "runspider", str(SPIDER)]
    for key, value in {"base": site.base, "pages": str(pages), **(args or {})}.items():
        command += ["-a", f"{key}={value}"]
    for key, value in {"DISCOVERY_URL": service.url, **settings}.items():
        command += ["-s", f"{key}={value}"]
    command += ["-O", str(items)]
    started = time.monotonic()
    done = venv.run(
        *command, cwd=tmp_path, timeout=180, DISCOVERY_TOKEN=TOKEN, CRAWL_STATS_FILE=str(stats)
    )
    seconds = time.monotonic() - started
    found = [json.loads(line) for line in items.read_text().splitlines()] if items.exists() else []
    numbers = json.loads(stats.read_text()) if stats.exists() else {}
    return done, found, numbers, seconds


def assert_rotated_past_bans(
    site: BanningSite, squids: list[Proxy], service: ServiceProcess
) -> set[str]:
    """What every crawl of the banning site must show; returns the banned proxies."""
    assert site.direct == 0
    assert dict(site.pages) == {page: 1 for page in range(PAGES)}
    # PAGES > 2 * LIMIT: every proxy served pages, none more than the site allows.
    assert set(site.served) == {p.address for p in squids}
    assert all(n <= LIMIT for n in site.served.values()), site.served
    banned = {p.name for p in squids if site.after_ban[p.address] > 0}
    assert banned, "no proxy was banned"
    for proxy in squids:
        # Only requests already in flight when the ban came went through it again.
        assert site.after_ban[proxy.address] <= IN_FLIGHT, site.after_ban
    with client(service) as http:
        listed = proxies(http)
    for name in banned:
        assert [c["target"] for c in listed[name]["cooldowns"]] == ["127.0.0.1"], listed[name]
    for name in {p.name for p in squids} - banned:
        assert listed[name]["cooldowns"] == []
    assert not any(p["leased"] for p in listed.values()), listed
    return banned


def test_scrapy_crawl_completes_only_by_rotating_past_bans(
    client_venv: ClientVenv, tmp_path: Path, squids: list[Proxy]
) -> None:
    # The site's ban is a 200 with a captcha: only the body pattern catches it.
    with crawl_service(tmp_path, squids) as service, banning_site(squids, (200, CAPTCHA)) as site:
        done, items, stats, seconds = run_spider(
            client_venv,
            tmp_path,
            service,
            site,
            pages=PAGES,
            settings={
                "DISCOVERY_PROXIES_PER_SITE": "2",
                "DISCOVERY_BAN_BODY": "solve this captcha",
                "DISCOVERY_WAIT": "20",
            },
        )
        assert done.returncode == 0, done.stderr[-5000:]
        banned = assert_rotated_past_bans(site, squids, service)
    print(f"\nscrapy crawl of {PAGES} pages through {len(squids)} proxies: {seconds:.1f} s")
    assert sorted(item["page"] for item in items) == list(range(PAGES))
    assert all(item["status"] == 200 for item in items)
    by_address = {p.address: p.name for p in squids}
    for item in items:
        # The page says whom it was served to: the proxy the middleware named.
        address = item["text"].split()[-1]
        assert item["proxy"] == by_address[address], item
    assert stats["discovery/reports/blocked"] == len(banned)
    assert stats["discovery/bans"] == stats["discovery/retries"] >= len(banned)
    assert "discovery/retries/exhausted" not in stats
    assert "retry/count" not in stats  # bans never counted against Scrapy's retries
    assert stats["discovery/leases/granted"] >= len(squids)
    assert stats["discovery/leases/granted"] == stats["discovery/leases/released"]
    assert stats["discovery/requests"] == PAGES + stats["discovery/retries"]
    assert PASSWORD not in done.stderr  # proxy credentials never logged


def test_scrapy_releases_every_lease_when_the_spider_fails(
    client_venv: ClientVenv, tmp_path: Path, squids: list[Proxy]
) -> None:
    with crawl_service(tmp_path, squids) as service, banning_site(squids) as site:
        done, _, stats, _ = run_spider(
            client_venv,
            tmp_path,
            service,
            site,
            pages=PAGES,
            settings={"DISCOVERY_PROXIES_PER_SITE": "3", "CLOSESPIDER_ERRORCOUNT": "1"},
            args={"fail_at": "2"},
        )
        assert "fails on purpose" in done.stderr
        assert stats["finish_reason"] == "closespider_errorcount"
        assert stats["discovery/leases/granted"] >= 1
        assert stats["discovery/leases/granted"] == stats["discovery/leases/released"]
        with client(service) as http:
            assert not any(p["leased"] for p in proxies(http).values())
        assert site.direct == 0


def test_scrapy_fails_requests_it_has_no_proxy_for_and_sends_none_directly(
    client_venv: ClientVenv, tmp_path: Path, squids: list[Proxy]
) -> None:
    with crawl_service(tmp_path, squids) as service, banning_site(squids) as site:
        done, items, stats, seconds = run_spider(
            client_venv,
            tmp_path,
            service,
            site,
            pages=3,
            # No proxy has this label: the service answers 409 (Retry-After: the probe interval).
            settings={"DISCOVERY_LABELS": '{"pool": "nowhere"}', "DISCOVERY_WAIT": "1.5"},
        )
    assert done.returncode == 0, done.stderr[-5000:]
    assert items == []
    assert site.direct == 0 and not site.served
    assert "409 no_proxy_available: no proxy for 127.0.0.1 after waiting 1.5 s" in done.stderr
    assert stats["discovery/no_proxy"] == 3
    assert stats["discovery/leases/denied"] >= 2  # asked again after Retry-After
    assert "discovery/leases/granted" not in stats
    assert seconds >= 1.5


def test_scrapy_stops_when_the_service_refuses_its_token(
    client_venv: ClientVenv, tmp_path: Path, squids: list[Proxy]
) -> None:
    with crawl_service(tmp_path, squids) as service, banning_site(squids) as site:
        done, items, stats, _ = run_spider(
            client_venv,
            tmp_path,
            service,
            site,
            pages=PAGES,
            settings={"DISCOVERY_TOKEN": "not-the-token"},
        )
    assert stats["finish_reason"] == "discovery_unauthorized"
    assert "401 unauthorized" in done.stderr
    assert items == []
    assert site.direct == 0 and not site.served
    assert "not-the-token" not in done.stderr


# -- httpx ---------------------------------------------------------------------------------


def httpx_crawl(venv: ClientVenv, tmp_path: Path, **job: Any) -> dict[str, Any]:
    """tests/support/httpx_crawl.py run by the client's environment from a
    directory of its own (a script's directory comes first on its path); its answer."""
    script = tmp_path / HTTPX_CRAWL.name
    shutil.copyfile(HTTPX_CRAWL, script)
    done = venv.run(str(script), json.dumps({"token": TOKEN, **job}), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-5000:]
    assert PASSWORD not in done.stdout + done.stderr  # proxy credentials never logged
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def check_pages(pages: list[list[Any]]) -> None:
    assert [status for status, _ in pages] == [200] * PAGES
    for page, (_, text) in enumerate(pages):
        assert text.startswith(f"page {page} for 127.0.0."), text


def check_stats(stats: dict[str, int], banned: set[str], squids: list[Proxy]) -> None:
    assert stats["reports/blocked"] == len(banned)
    assert stats["bans"] == stats["retries"] >= len(banned)
    assert "retries/exhausted" not in stats
    assert stats["leases/granted"] >= len(squids)
    assert stats["leases/granted"] == stats["leases/released"]
    assert stats["requests"] == PAGES + stats["retries"]


@pytest.mark.parametrize(
    ("mode", "ban", "options"),
    [
        ("sync", (403, b"banned\n"), {}),
        ("async", (429, b"slow down\n"), {"per_site": 2}),
    ],
)
def test_httpx_clients_rotate_past_bans(
    client_venv: ClientVenv,
    tmp_path: Path,
    squids: list[Proxy],
    mode: str,
    ban: tuple[int, bytes],
    options: dict[str, Any],
) -> None:
    with crawl_service(tmp_path, squids) as service, banning_site(squids, ban) as site:
        started = time.monotonic()
        crawled = httpx_crawl(
            client_venv,
            tmp_path,
            mode=mode,
            service=service.url,
            base=site.base,
            pages=PAGES,
            in_flight=IN_FLIGHT,
            options=options,
        )
        seconds = time.monotonic() - started
        check_pages(crawled["pages"])
        assert crawled["held_while_open"], "leases are held while the client is open"
        banned = assert_rotated_past_bans(site, squids, service)
    print(f"\nhttpx ({mode}, {IN_FLIGHT} in flight) crawl of {PAGES} pages: {seconds:.1f} s")
    check_stats(crawled["stats"], banned, squids)


def test_httpx_client_raises_when_no_proxy_can_be_had(
    client_venv: ClientVenv, tmp_path: Path, squids: list[Proxy]
) -> None:
    with crawl_service(tmp_path, squids) as service, banning_site(squids) as site:
        crawled = httpx_crawl(
            client_venv, tmp_path, mode="nowhere", service=service.url, base=site.base
        )
        assert "no proxy for 127.0.0.1 after waiting 1 s" in crawled["error"]
        assert site.direct == 0 and not site.served
