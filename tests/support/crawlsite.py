"""What the crawler tests crawl: a site that bans proxies, squids it can tell
apart, and the discovery service handing them out.

- :class:`BanningSite`: pages on 127.0.0.1 that each client address gets
  `limit` of; after that the address is banned (403, or what `ban_answers`
  says for it) and every further request from it is counted as "after the
  ban". Requests from 127.0.0.1 itself came without a proxy: counted as
  direct and refused.
- :func:`start_proxies`: real squids on 127.0.0.1, each reaching the site
  from an address of its own (`tcp_outgoing_address 127.0.0.N`), so the
  site knows which proxy a request came through.
- :func:`crawl_service`: `python -m discovery serve` over those squids.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support.discovery import (
    ServiceProcess,
    all_healthy,
    api_client,
    free_port,
    proxies,
    proxy_entry,
    write_fleet,
)
from tests.support.http import ServedInThread
from tests.support.squid import EchoServer, RunningSquid, loopback_settings, start_squid

DIRECT = "127.0.0.1"
PAGE = re.compile(r"/page/([0-9]+)")
TOKEN = "crawl-token-" + "5e6f7a8b9c0d" * 3
PASSWORD = "crawl-pw-" + "n0t-in-l0gs"


class BanningSite(ServedInThread):
    """See the module's doc. `delay` seconds per answer keep requests in flight."""

    def __init__(
        self,
        limit: int,
        *,
        ban_answers: Mapping[str, tuple[int, bytes]] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.limit = limit
        self.ban_answers = dict(ban_answers or {})
        self.delay = delay
        self.served: Counter[str] = Counter()  # pages served, by client address
        self.after_ban: Counter[str] = Counter()  # requests after the address was banned
        self.pages: Counter[int] = Counter()  # times each page was served
        self.direct = 0
        self._lock = threading.Lock()
        self._serve(ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self)))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def banned(self) -> set[str]:
        with self._lock:
            return {address for address, n in self.served.items() if n >= self.limit}

    def answer(self, address: str, path: str) -> tuple[int, bytes]:
        time.sleep(self.delay)
        match = PAGE.fullmatch(path)
        with self._lock:
            if address == DIRECT:
                self.direct += 1
                return 403, b"no direct requests here\n"
            if match is None:
                return 404, b"not found\n"
            if self.served[address] >= self.limit:
                self.after_ban[address] += 1
                return self.ban_answers.get(address, (403, b"banned\n"))
            self.served[address] += 1
            self.pages[int(match.group(1))] += 1
        return 200, f"page {match.group(1)} for {address}\n".encode()


def _handler_for(site: BanningSite) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = site.answer(self.client_address[0], self.path.split("?", 1)[0])
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@dataclass
class Proxy:
    name: str
    address: str  # where the site sees it coming from
    squid: RunningSquid


@contextmanager
def start_proxies(count: int) -> Iterator[list[Proxy]]:
    """`count` squids with auth, proxy `sq<i>` reaching out from 127.0.0.<i+2>."""
    with ExitStack() as stack:
        started = []
        for i in range(count):
            address = f"127.0.0.{i + 2}"
            squid = start_squid(
                loopback_settings(auth_username="crawler"),
                password=PASSWORD,
                extra_config=[f"tcp_outgoing_address {address}"],
            )
            stack.callback(squid.close)
            started.append(Proxy(f"sq{i}", address, squid))
        yield started


def fleet_entries(running: list[Proxy]) -> list[dict[str, Any]]:
    return [
        proxy_entry(p.name, port=p.squid.port, username="crawler", password=PASSWORD)
        for p in running
    ]


@contextmanager
def crawl_service(
    tmp_path: Path,
    running: list[Proxy],
    *,
    max_ttl: int = 60,
    cooldown: int = 600,
    extra: list[str] | None = None,
    db: str | None = None,
) -> Iterator[ServiceProcess]:
    """The discovery service over `running`, ready and with every proxy healthy."""
    probe_target = EchoServer()
    fleet = tmp_path / "fleet.json"
    write_fleet(fleet, fleet_entries(running))
    args = ["--fleet", str(fleet), "--db", db or str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}"]
    args += ["--probe-target", f"127.0.0.1:{probe_target.port}", "--probe-interval", "0.5"]
    args += ["--max-lease-ttl", str(max_ttl), "--lease-cooldown", str(cooldown)]
    args += extra or []
    service = ServiceProcess(
        args, log_path=tmp_path / "service.log", env={"DISCOVERY_TOKEN": TOKEN}
    )
    try:
        service.start()
        with client(service) as http:
            deadline = time.monotonic() + 20
            while not all_healthy(http, {p.name for p in running}):
                if time.monotonic() > deadline:
                    raise AssertionError(f"proxies not healthy: {proxies(http)}")
                time.sleep(0.1)
        yield service
    finally:
        service.stop()
        probe_target.close()


def client(service: ServiceProcess) -> httpx.Client:
    return api_client(service.url, TOKEN)


def reported_errors(service: ServiceProcess) -> float:
    """Crawlers' `error` reports the health engine counted against proxies."""
    for line in httpx.get(service.url + "/metrics").text.splitlines():
        if line.startswith("egress_health_reported_errors_total "):
            return float(line.split()[1])
    raise AssertionError("no egress_health_reported_errors_total in /metrics")


def assert_no_proxy_blamed(service: ServiceProcess) -> None:
    """No `error` report reached the health engine, and every proxy is healthy."""
    assert reported_errors(service) == 0.0
    with client(service) as http:
        listed = proxies(http)
    assert all(p["health"] == "healthy" for p in listed.values()), listed
