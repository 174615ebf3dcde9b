"""The fleet status page in a real browser: Debian's headless Chromium, driven by
playwright, against `python -m discovery serve` probing real squids (and, for
the 10,000-proxy fleet, the app in a thread with health the test sets).

Screenshots land in .cache/artifacts/status-page/. With
EGRESS_PROXIES_DOCS_SCREENSHOT=1 (scripts/docs-screenshot) the mixed-fleet
test also writes docs/images/status-page.png."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from health.model import Health
from tests.support.browser import artifact
from tests.support.discovery import (
    ROOT,
    ServerThread,
    ServiceProcess,
    free_port,
    proxy_entry,
    settings_for,
    wait_for,
    write_fleet,
)
from tests.support.squid import EchoServer, RunningSquid, loopback_settings, start_squid

pytestmark = pytest.mark.integration

TOKEN = "ui-token-" + "5e6f7a8b9c0d" * 3
PASSWORD = "squid-pw-" + "n3ver-on-the-page"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DOCS_IMAGE = ROOT / "docs" / "images" / "status-page.png"
UPDATE = 8_000  # ms: a few probe intervals (1 s) plus a poll (2 s)


@pytest.fixture(scope="module")
def target() -> Iterator[EchoServer]:
    listener = EchoServer()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def squid() -> Iterator[RunningSquid]:
    with start_squid(loopback_settings(auth_username="crawler"), password=PASSWORD) as running:
        yield running


def entry(name: str, port: int, **extra: Any) -> dict[str, Any]:
    extra.setdefault("labels", {"slot": name})
    return proxy_entry(name, port=port, username="crawler", password=PASSWORD, **extra)


def service(
    tmp_path: Path,
    target: EchoServer,
    entries: list[dict[str, Any]],
    probe_targets: list[str] | None = None,
) -> ServiceProcess:
    """The service on ENTRIES, probing through TARGET unless PROBE_TARGETS say otherwise."""
    write_fleet(tmp_path / "fleet.json", entries)
    args = ["--fleet", str(tmp_path / "fleet.json"), "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-interval", "1"]
    for probe_target in probe_targets or [f"127.0.0.1:{target.port}"]:
        args += ["--probe-target", probe_target]
    args += ["--max-lease-ttl", "600", "--lease-cooldown", "900"]
    env = {"DISCOVERY_TOKEN": TOKEN, "EGRESS_PROXIES_LOG": "debug"}
    return ServiceProcess(args, log_path=tmp_path / "service.log", env=env).start()


def log_in(page: Page, url: str, token: str = TOKEN) -> None:
    page.goto(url + "/ui/")
    page.fill("#token", token)
    page.click("#login button[type=submit]")


def row(page: Page, name: str) -> Any:
    return page.locator(f'#fleet tr[data-proxy="{name}"]')


def healthy(client: httpx.Client, names: set[str]) -> bool:
    listed = {p["name"]: p for p in client.get("/v1/proxies").json()["proxies"]}
    return all(listed[n]["health"] == "healthy" for n in names)


def test_the_page_asks_for_the_token_and_its_cookie_opens_nothing_else(
    tmp_path: Path, target: EchoServer, squid: RunningSquid, browser: Browser
) -> None:
    running = service(tmp_path, target, [entry(n, squid.port) for n in ("a", "b")])
    context = browser.new_context()
    urls: list[str] = []
    try:
        page = context.new_page()
        page.on("request", lambda request: urls.append(request.url))
        page.goto(running.url + "/")  # redirected to /ui/
        expect(page.locator("#token")).to_be_visible()
        expect(page.locator("#fleet")).to_have_count(0)
        assert httpx.get(running.url + "/ui/api/status").status_code == 401

        log_in(page, running.url, "not-the-token")
        expect(page.get_by_role("alert")).to_have_text("Wrong token.")
        assert context.cookies() == []

        log_in(page, running.url)
        expect(page.locator("#t-proxies")).to_have_text("2")
        expect(row(page, "a")).to_be_visible()
        expect(page.locator("#t-healthy")).to_have_text("2", timeout=UPDATE)
        [cookie] = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
        assert TOKEN not in cookie["value"]

        # The cookie reads the page's data, and nothing under /v1 (CSRF).
        jar = {cookie["name"]: cookie["value"]}
        data = httpx.get(running.url + "/ui/api/status", cookies=jar)
        assert data.status_code == 200 and data.json()["totals"]["proxies"] == 2
        with httpx.Client(base_url=running.url, cookies=jar) as client:
            assert client.post("/v1/leases", json={"holder": "csrf"}).status_code == 401
            assert client.get("/v1/proxies").status_code == 401
        bearer = httpx.get(running.url + "/ui/api/status", headers=AUTH)
        assert bearer.status_code == 200

        # Never the token or a password: not in a URL, the page, its data, or the log.
        for text in (page.content(), data.text, bearer.text, running.log(), *urls):
            assert TOKEN not in text and PASSWORD not in text
        page.screenshot(path=artifact("logged-in.png"), full_page=True)

        page.click(".logout button")
        expect(page.locator("#token")).to_be_visible()
        assert context.cookies() == []
        # Revoked, not only deleted: a copy of the cookie opens nothing either.
        assert httpx.get(running.url + "/ui/api/status", cookies=jar).status_code == 401
        assert httpx.get(running.url + "/ui/", cookies=jar).status_code == 401
    finally:
        context.close()
        running.stop()


def test_a_stopped_proxy_turns_unhealthy_on_the_page_without_a_reload(
    tmp_path: Path, target: EchoServer, squid: RunningSquid, browser: Browser
) -> None:
    victim = start_squid(loopback_settings(auth_username="crawler"), password=PASSWORD)
    running = service(tmp_path, target, [entry("victim", victim.port), entry("steady", squid.port)])
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in(page, running.url)
        expect(row(page, "victim").locator(".health")).to_have_text("healthy", timeout=UPDATE)
        expect(row(page, "victim").locator(".latency")).to_contain_text("ms")
        page.evaluate("window.loadedOnce = 'yes'")  # gone if the page reloads

        stopped = time.monotonic()
        victim.stop()
        expect(row(page, "victim").locator(".health .badge")).to_have_text(
            "unhealthy", timeout=UPDATE
        )
        took = time.monotonic() - stopped
        expect(row(page, "victim").locator(".health .error")).to_contain_text("refused")
        expect(row(page, "steady").locator(".health")).to_have_text("healthy")
        expect(page.locator("#t-unhealthy")).to_have_text("1")
        assert page.evaluate("window.loadedOnce") == "yes"
        page.screenshot(path=artifact("stopped-proxy.png"), full_page=True)
        print(f"unhealthy on the page {took:.1f} s after the squid stopped")
    finally:
        context.close()
        running.stop()
        victim.close()


def test_a_lease_and_a_ban_show_on_the_page(
    tmp_path: Path, target: EchoServer, squid: RunningSquid, browser: Browser
) -> None:
    running = service(tmp_path, target, [entry(n, squid.port) for n in ("a", "b", "c")])
    context = browser.new_context()
    try:
        with httpx.Client(base_url=running.url, headers=AUTH, timeout=10) as api:
            wait_for(lambda: healthy(api, {"a", "b", "c"}), timeout=15)
            page = context.new_page()
            log_in(page, running.url)
            expect(page.locator("#t-leased")).to_have_text("0")

            lease = api.post(
                "/v1/leases",
                json={"holder": "crawler-7@host:42", "selector": {"labels": {"slot": "b"}}},
            ).json()
            lease_cell = row(page, "b").locator(".lease")
            expect(lease_cell).to_contain_text("leased", timeout=UPDATE)
            expect(lease_cell).to_contain_text("crawler-7@host:42")
            expect(lease_cell.locator(".left")).to_contain_text("min left")
            expect(row(page, "a").locator(".lease")).to_have_text("free")
            expect(page.locator("#t-leased")).to_have_text("1")

            report = {"outcome": "blocked", "target": "https://shop.example/item/1"}
            assert api.post(f"/v1/leases/{lease['id']}/report", json=report).status_code == 204
            cooldown = row(page, "b").locator('.cooldown[data-target="shop.example"]')
            expect(cooldown).to_contain_text("shop.example", timeout=UPDATE)
            expect(cooldown).to_contain_text("min left")
            expect(page.locator("#t-cooling")).to_have_text("1")

            # The state filter narrows the table to the cooling proxy.
            page.select_option("#filters select[name=state]", "cooling")
            expect(page.locator("#fleet tbody tr")).to_have_count(1)
            expect(page.locator("#range")).to_have_text("1-1 of 1")
            page.screenshot(path=artifact("lease-and-ban.png"), full_page=True)
    finally:
        context.close()
        running.stop()


def test_the_screenshot_shows_healthy_unhealthy_leased_and_cooling_proxies(
    tmp_path: Path, target: EchoServer, squid: RunningSquid, browser: Browser
) -> None:
    dead = free_port()  # nothing listens there: refused, unhealthy
    layout = [
        ("home-0", "kvm-home", "kvm", "nas1", squid.port),
        ("home-1", "kvm-home", "kvm", "nas1", squid.port),
        ("home-2", "kvm-home", "kvm", "nas2", dead),
        ("gcp-eu-0", "gcp-eu", "gcp", "europe-west1-b", squid.port),
        ("gcp-eu-1", "gcp-eu", "gcp", "europe-west1-c", squid.port),
        ("gcp-eu-2", "gcp-eu", "gcp", "europe-west1-c", squid.port),
        ("cluster-0", "cluster", "kubernetes", "k8s-a", squid.port),
        ("cluster-1", "cluster", "kubernetes", "k8s-a", dead),
        ("corp-1", "corp", "external", None, squid.port),
    ]
    entries = []
    for name, provider, kind, zone, port in layout:
        item = entry(name, port, provider=provider, zone=zone, labels={"site": provider})
        item["type"] = kind
        entries.append(item)
    running = service(tmp_path, target, entries)
    context = browser.new_context(viewport={"width": 1400, "height": 760})
    try:
        with httpx.Client(base_url=running.url, headers=AUTH, timeout=10) as api:
            up = {name for name, *_, port in layout if port != dead}
            wait_for(lambda: healthy(api, up), timeout=15)
            for holder, slot in (("news-crawler@c1:811", "gcp-eu"), ("shop-crawler@c2:97", "corp")):
                api.post(
                    "/v1/leases", json={"holder": holder, "selector": {"provider": slot}}
                ).raise_for_status()
            banned = api.post(
                "/v1/leases",
                json={"holder": "price-bot@c3:5", "selector": {"provider": "cluster"}},
            ).json()
            for site in ("shop.example", "news.example"):
                api.post(
                    f"/v1/leases/{banned['id']}/report", json={"outcome": "blocked", "target": site}
                ).raise_for_status()
            api.delete(f"/v1/leases/{banned['id']}").raise_for_status()
            page = context.new_page()
            log_in(page, running.url)
            expect(page.locator("#t-unhealthy")).to_have_text("2", timeout=UPDATE)
            expect(page.locator("#t-leased")).to_have_text("2")
            expect(page.locator("#t-cooling")).to_have_text("1")
            expect(page.locator("#t-grants")).to_have_text("3")
            # A few probes for the sparklines.
            expect(row(page, "home-0").locator("svg.spark polyline")).to_have_count(1)
            page.wait_for_timeout(3000)
            shot = artifact("status-page.png")
            page.screenshot(path=shot, full_page=True)
            assert shot.stat().st_size > 10_000
    finally:
        context.close()
        running.stop()
    if os.environ.get("EGRESS_PROXIES_DOCS_SCREENSHOT") == "1":
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGE)


def test_a_fleet_of_ten_thousand_comes_one_page_per_refresh(
    tmp_path: Path, browser: Browser
) -> None:
    zones = ("nas1", "nas2", "europe-west1-b", "k8s-a")
    entries = [
        proxy_entry(f"p{i:05d}", port=3128, zone=zones[i % 4], labels={"shard": str(i % 10)})
        for i in range(10_000)
    ]
    write_fleet(tmp_path / "fleet.json", entries)
    # No token on loopback: the page needs no login.
    with ServerThread(settings_for(tmp_path, probe_interval=60)) as server:
        assert server.fake is not None
        fake = server.fake
        server.call(lambda: fake.set("p00007", Health.UNHEALTHY, "refused: test"))
        context = browser.new_context()
        try:
            page = context.new_page()
            statuses: list[str] = []
            page.on(
                "request",
                lambda r: statuses.append(r.url) if "/ui/api/" in r.url else None,
            )
            page.goto(server.url + "/ui/")
            expect(page.locator("#t-proxies")).to_have_text("10000")
            expect(page.locator("#t-unhealthy")).to_have_text("1")
            expect(page.locator("#fleet tbody tr")).to_have_count(100)
            expect(page.locator("#range")).to_have_text("1-100 of 10000")
            page.click("#next")
            expect(page.locator("#range")).to_have_text("101-200 of 10000")
            expect(row(page, "p00100")).to_be_visible()
            page.select_option("#filters select[name=zone]", "nas2")
            expect(page.locator("#range")).to_have_text("1-100 of 2500")
            page.select_option("#filters select[name=zone]", "")
            page.select_option("#filters select[name=state]", "unhealthy")
            expect(page.locator("#range")).to_have_text("1-1 of 1")
            expect(row(page, "p00007").locator(".error")).to_have_text("refused: test")
            # Refreshes keep coming, each one request (not one per proxy).
            seen = len(statuses)
            page.wait_for_timeout(4500)
            assert 1 <= len(statuses) - seen <= 4
            started = time.monotonic()
            answer = httpx.get(server.url + "/ui/api/status?limit=100", timeout=10)
            took = time.monotonic() - started
            assert answer.status_code == 200 and len(answer.json()["proxies"]) == 100
            assert len(answer.content) < 100_000, len(answer.content)
            print(f"status of 10,000 proxies: {took * 1000:.0f} ms, {len(answer.content)} bytes")
            page.screenshot(path=artifact("ten-thousand.png"))
        finally:
            context.close()


def test_a_probe_target_down_is_said_on_the_page(
    tmp_path: Path, target: EchoServer, squid: RunningSquid, browser: Browser, refused: str
) -> None:
    """Six proxies, a port nothing listens on as the first probe target and
    the echo server second: the proxies are healthy through the second, and
    the page says the first looks down (docs/discovery.md, "A probe target
    down"); with nothing down, it says nothing."""
    closed = refused
    six = [entry(f"p{i}", squid.port) for i in range(6)]
    for place in ("both", "alone", "quiet"):
        (tmp_path / place).mkdir()
    running = service(tmp_path / "both", target, six, [closed, f"127.0.0.1:{target.port}"])
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in(page, running.url)
        note = page.locator("#targets-down")
        expect(note).to_have_text(
            f"Probe target {closed} looks down: probes go through the other targets.",
            timeout=UPDATE,
        )
        expect(page.locator("#t-healthy")).to_have_text("6", timeout=UPDATE)
        page.screenshot(path=artifact("probe-target-down.png"), full_page=True)
    finally:
        context.close()
        running.stop()
    # The closed port alone: nothing proves a proxy works, none is counted down.
    alone = service(tmp_path / "alone", target, six, [closed])
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in(page, alone.url)
        expect(page.locator("#targets-down")).to_have_text(
            f"Probe target {closed} looks down: probes count for nothing and the proxies keep "
            "the health they had: check the target and the fleet's way out.",
            timeout=UPDATE,
        )
        expect(page.locator("#t-unhealthy")).to_have_text("0")
    finally:
        context.close()
        alone.stop()
    quiet = service(tmp_path / "quiet", target, [entry("a", squid.port)])
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in(page, quiet.url)
        expect(page.locator("#t-healthy")).to_have_text("1", timeout=UPDATE)
        expect(page.locator("#targets-down")).to_be_hidden()
    finally:
        context.close()
        quiet.stop()
