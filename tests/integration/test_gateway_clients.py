"""The gateway (docs/gateway.md) as each kind of client uses it, with no code
of the project on the client's side: curl (Debian's), requests, plain httpx
(`httpx.Client(proxy=...)`, not the project's transport), Scrapy with its
stock HttpProxyMiddleware (the proxy in `request.meta` or in the
environment), and Debian's Chromium through playwright (`--proxy-server`,
and playwright's own `proxy=`), admitted by address (`--gateway-allow`,
no credentials). Each fetches an http:// and an https:// page of a site on
127.0.0.1 that records the address each request came from.

https://: a local CA (tests/support/gateway_site.py) signs the site's
certificate for 127.0.0.1; curl (--cacert), requests (verify=) and httpx (an
ssl context) trust that CA and check the name. Scrapy does not verify
certificates by default. Chromium takes the site's key by its SPKI hash
(--ignore-certificate-errors-spki-list: only that key is accepted; trusting
a CA needs an NSS database and certutil, which no project list installs).

What every test asserts: the answer is the site's page for that request, the
site saw it from the outgoing address of a squid (127.0.0.2 and up) whose
lease the client's holder holds through the gateway, without the client's
proxy credentials, and nothing ever reached the site from 127.0.0.1 itself.

One service, one set of squids and one pair of sites serve the whole module;
each holder's requests for the site share one lease (--gateway-site-leases
1), and there are as many squids as holders, so no test waits for a proxy.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import requests
from playwright.sync_api import Browser, sync_playwright

from tests.support.browser import CHROMIUM, FLAGS
from tests.support.crawlsite import TOKEN, Proxy, client, crawl_service, start_proxies
from tests.support.discovery import ROOT, ServiceProcess, free_port
from tests.support.gateway_site import DIRECT, LocalCA, SeeingSite, make_ca

pytestmark = pytest.mark.integration

SCHEMES = ("http", "https")
CURL = "/usr/bin/curl"
# A session each (one lease, whatever the site); requests and Scrapy without one
# (a site set of one lease); the browsers share their address's session.
CURL_USER = "curl-session-c1"
HTTPX_USER = "httpx-session-h1"
SQUIDS = 5
TIMEOUT = 20
PROXY_VARIABLES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


@dataclass
class World:
    tmp: Path
    squids: list[Proxy]
    sites: dict[str, SeeingSite]  # by scheme
    ca: LocalCA
    service: ServiceProcess
    port: int  # the gateway's

    def proxy(self, user: str | None = None) -> str:
        """The gateway as a proxy URL, with USER:TOKEN unless `user` is None."""
        credentials = f"{user}:{TOKEN}@" if user is not None else ""
        return f"http://{credentials}127.0.0.1:{self.port}"

    def url(self, scheme: str, who: str) -> tuple[str, str]:
        """(a URL of the site no other request asks for, its path)."""
        path = f"/{who}/{scheme}/{secrets.token_hex(4)}"
        return self.sites[scheme].base + path, path

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment without proxy settings, and `extra`."""
        env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
        return {**env, **extra}

    def holders(self) -> dict[str, str | None]:
        """Proxy name -> the holder of its lease (the status page's data)."""
        with client(self.service) as http:
            rows = http.get("/ui/api/status", params={"limit": 500}).json()["proxies"]
        return {r["name"]: (r["lease"] or {}).get("holder") for r in rows}

    def check(self, scheme: str, path: str, status: int, text: str, holder: str) -> None:
        """The site answered this request, which came from a squid that `holder`
        holds through the gateway, and nothing came to the site directly."""
        site = self.sites[scheme]
        assert site.direct == 0, dict(site.seen)
        assert status == 200, (status, text)
        [address] = site.seen[path]
        by_address = {p.address: p.name for p in self.squids}
        assert address in by_address and address != DIRECT, address
        assert text == f"{path} for {address}\n"
        assert self.holders()[by_address[address]] == holder, self.holders()
        assert not site.handshake_errors, site.handshake_errors
        # The client's credentials (the service's token) stopped at the gateway.
        headers = site.headers[path]
        assert "proxy-authorization" not in dict(headers), headers
        assert not [h for h in headers if TOKEN in h[1]], headers


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gateway-clients")
    ca = make_ca(tmp / "ca")
    port = free_port()
    extra = ["--gateway", f"127.0.0.1:{port}", "--gateway-allow", f"{DIRECT}/32"]
    extra += ["--gateway-site-leases", "1"]
    with ExitStack() as stack:
        squids = stack.enter_context(start_proxies(SQUIDS))
        sites = {
            "http": stack.enter_context(SeeingSite()),
            "https": stack.enter_context(SeeingSite(ca.server_context())),
        }
        service = stack.enter_context(crawl_service(tmp, squids, extra=extra))
        yield World(tmp, squids, sites, ca, service, port)


# -- curl ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_curl(world: World, scheme: str) -> None:
    url, path = world.url(scheme, "curl")
    body = world.tmp / f"curl-{scheme}.txt"
    command = [CURL, "-sS", "--max-time", str(TIMEOUT), "--proxy", world.proxy(CURL_USER)]
    command += ["--cacert", str(world.ca.ca_pem), "--output", str(body)]
    command += ["--write-out", "%{http_code}", url]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=world.env(),
        timeout=TIMEOUT + 10,
    )
    assert done.returncode == 0, done.stderr
    world.check(scheme, path, int(done.stdout), body.read_text(), CURL_USER)


# -- requests and httpx --------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_requests(world: World, scheme: str) -> None:
    url, path = world.url(scheme, "requests")
    with requests.Session() as session:
        session.trust_env = False  # no proxy settings from the environment
        proxy = world.proxy("requests")
        answer = session.get(
            url,
            proxies={"http": proxy, "https": proxy},
            verify=str(world.ca.ca_pem),
            timeout=TIMEOUT,
        )
    world.check(scheme, path, answer.status_code, answer.text, "requests")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_httpx(world: World, scheme: str) -> None:
    url, path = world.url(scheme, "httpx")
    with httpx.Client(
        proxy=world.proxy(HTTPX_USER),
        verify=world.ca.client_context(),
        trust_env=False,
        timeout=TIMEOUT,
    ) as http:
        answer = http.get(url)
    world.check(scheme, path, answer.status_code, answer.text, HTTPX_USER)


# -- Scrapy --------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("given", ["meta", "environment"])
def test_scrapy(world: World, scheme: str, given: str) -> None:
    """`python -m tests.support.gateway_site` runs the crawl: Scrapy's stock
    HttpProxyMiddleware turns the proxy URL's credentials into Proxy-Authorization
    (on the CONNECT for https)."""
    url, path = world.url(scheme, f"scrapy-{given}")
    out = world.tmp / f"scrapy-{given}-{scheme}.json"
    command = [sys.executable, "-m", "tests.support.gateway_site", url, str(out)]
    env = world.env(PYTHONPATH=str(ROOT))
    if given == "meta":
        command.append(world.proxy("scrapy"))
    else:
        env["http_proxy"] = env["https_proxy"] = world.proxy("scrapy")
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT + 30
    )
    assert done.returncode == 0, done.stderr[-5000:]
    answers = json.loads(out.read_text())
    assert len(answers) == 1, done.stderr[-5000:]
    [answer] = answers
    world.check(scheme, path, answer["status"], answer["text"], "scrapy")
    assert TOKEN not in done.stderr  # the proxy's credentials never logged


# -- Chromium ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromiums(world: World) -> Iterator[dict[str, Browser]]:
    """Chromium told of the gateway two ways, with no credentials (the gateway
    admits 127.0.0.1 by address): its own --proxy-server flag, and playwright's
    proxy option. Chromium never proxies loopback unless told to: the flag needs
    --proxy-bypass-list=<-loopback>, playwright's option adds it by itself."""
    trust = f"--ignore-certificate-errors-spki-list={world.ca.spki_sha256}"
    gateway = world.proxy()
    with sync_playwright() as playwright:
        launched: dict[str, Browser] = {}
        try:
            launched["--proxy-server"] = playwright.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=[
                    *FLAGS,
                    trust,
                    f"--proxy-server={gateway}",
                    "--proxy-bypass-list=<-loopback>",
                ],
            )
            launched["playwright proxy"] = playwright.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=[*FLAGS, trust],
                proxy={"server": gateway},
            )
            yield launched
        finally:
            for browser in launched.values():
                browser.close()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("how", ["--proxy-server", "playwright proxy"])
def test_chromium(world: World, chromiums: dict[str, Browser], scheme: str, how: str) -> None:
    url, path = world.url(scheme, "chromium")
    context = chromiums[how].new_context()
    try:
        page = context.new_page()
        started = time.monotonic()
        response = page.goto(url, timeout=TIMEOUT * 1000)
        assert response is not None, f"no answer after {time.monotonic() - started:.1f} s"
        text = response.text()
        assert page.inner_text("body").strip() == text.strip()  # what the page shows
        # The address is the browser's session (docs/gateway.md, "Browsers").
        world.check(scheme, path, response.status, text, f"address-{DIRECT}-session-{DIRECT}")
    finally:
        context.close()
