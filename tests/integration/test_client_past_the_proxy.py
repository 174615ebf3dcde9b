"""Failures past the proxy, through real squids and the real discovery
service: a site whose certificate no client trusts, one that cuts the TLS
handshake off, a port squid's CONNECT finds closed (its 503), a server that
never answers, a host that drops connections. The crawler client (its httpx
transports in process, its Scrapy middleware in a spider run as crawler
authors run one, the client's wheel in a virtualenv of its own) raises or
logs them and reports nothing: each `error` report counts as a failed probe,
two in a row make a proxy unhealthy, and a crawl over a few dead links would
otherwise take healthy proxies out one after another. What a proxy's own
failure is (no connection to it, a 407) is reported: test_crawler_pool.py,
test_client_shared_rules.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from egress_proxies_client import AsyncDiscoveryTransport, DiscoveryTransport
from tests.support.client_venv import ClientVenv
from tests.support.crawlsite import (
    TOKEN,
    BanningSite,
    Proxy,
    assert_no_proxy_blamed,
    client,
    crawl_service,
    start_proxies,
)
from tests.support.deadsites import SilentSite, TlsSite, UnreachableSite, refused_port
from tests.support.discovery import ROOT, proxies
from tests.support.gateway_site import make_ca

pytestmark = pytest.mark.integration

SPIDER = ROOT / "tests" / "support" / "crawl_spider.py"


@dataclass(frozen=True)
class Failing:
    url: str
    raises: type[httpx.TransportError]  # what httpx raises for it


@pytest.fixture(scope="module")
def squids() -> Iterator[list[Proxy]]:
    with start_proxies(2) as running:
        yield running


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Failing]]:
    with ExitStack() as stack:
        untrusted = stack.enter_context(
            TlsSite(make_ca(tmp_path_factory.mktemp("ca")).server_context())
        )
        cut = stack.enter_context(TlsSite(None))
        silent = stack.enter_context(SilentSite())
        unreachable = stack.enter_context(UnreachableSite())
        closed = stack.enter_context(refused_port())
        yield {
            "untrusted certificate": Failing(untrusted.url, httpx.ConnectError),
            "TLS cut off": Failing(cut.url, httpx.ConnectError),
            "CONNECT to a closed port": Failing(f"https://127.0.0.1:{closed}/", httpx.ProxyError),
            "no answer": Failing(silent.url, httpx.ReadTimeout),
            "CONNECT never answered": Failing(
                f"https://{unreachable.authority}/", httpx.ReadTimeout
            ),
        }


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_httpx_transports_raise_a_failure_past_the_proxy_and_report_nothing(
    tmp_path: Path, squids: list[Proxy], failing: dict[str, Failing], mode: str
) -> None:
    with crawl_service(tmp_path, squids) as service, BanningSite(limit=100) as site:
        urls = [f.url for f in failing.values()] + [f"{site.base}/page/1"]
        if mode == "async":
            transport = AsyncDiscoveryTransport(service.url, token=TOKEN, wait=5)

            async def crawl() -> list[httpx.Response | Exception]:
                got: list[httpx.Response | Exception] = []
                async with httpx.AsyncClient(transport=transport, timeout=1) as http:
                    for url in urls:
                        try:
                            got.append(await http.get(url))
                        except httpx.TransportError as error:
                            got.append(error)
                return got

            answers = asyncio.run(crawl())
            stats = dict(transport.stats)
        else:
            sync = DiscoveryTransport(service.url, token=TOKEN, wait=5)
            answers = []
            with httpx.Client(transport=sync, timeout=1) as http:
                for url in urls:
                    try:
                        answers.append(http.get(url))
                    except httpx.TransportError as error:
                        answers.append(error)
            stats = dict(sync.stats)
        *errors, page = answers
        assert [type(e) for e in errors] == [f.raises for f in failing.values()], errors
        assert isinstance(page, httpx.Response) and page.status_code == 200
        assert stats["errors/site"] == len(failing)
        assert "reports/error" not in stats, stats
        assert_no_proxy_blamed(service)


def test_the_scrapy_middleware_reports_nothing_for_a_failure_past_the_proxy(
    client_venv: ClientVenv, tmp_path: Path, squids: list[Proxy], failing: dict[str, Failing]
) -> None:
    stats_file = tmp_path / "stats.json"
    with crawl_service(tmp_path, squids) as service:
        urls = ",".join(f.url for f in failing.values())
        done = client_venv.run(
            *("-m", "scrapy", "runspider", str(SPIDER), "-a", f"urls={urls}"),
            *("-s", f"DISCOVERY_URL={service.url}", "-s", "DOWNLOAD_TIMEOUT=1"),
            *("-s", "RETRY_TIMES=1", "-s", "DISCOVERY_WAIT=5"),
            cwd=tmp_path,
            timeout=120,
            DISCOVERY_TOKEN=TOKEN,
            CRAWL_STATS_FILE=str(stats_file),
        )
        assert done.returncode == 0, done.stderr[-5000:]
        stats = json.loads(stats_file.read_text())
        # Each URL failed, and was tried once more (RETRY_TIMES=1): nothing fetched.
        assert stats["downloader/exception_count"] == 2 * len(failing), stats
        kinds = {k.rsplit("/", 1)[1] for k in stats if k.startswith("downloader/exception_type")}
        assert "scrapy.exceptions.DownloadTimeoutError" in kinds, kinds
        assert any(k.endswith(".TunnelError") for k in kinds), kinds
        assert "discovery/reports/error" not in stats, stats
        assert_no_proxy_blamed(service)
        with client(service) as http:
            assert not any(p["leased"] for p in proxies(http).values())
