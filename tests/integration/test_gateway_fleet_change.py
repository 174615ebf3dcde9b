"""The gateway when proxies leave the fleet (issue 40: a recycle renames
`home-0` to `home-0-g2`, docs/autopilot.md "Generations"): the service reads
a manifest without the old names and ends their leases; the gateway moves
its sessions and site sets off them at once.

What holds, on both stores: a client with a session (httpx, keep-alive to
the gateway, so a kept connection to the old squid is there to be misused)
and a client without one (curl, a site set) keep getting 200s, and from the
moment the service lists the new fleet their requests and new tunnels leave
through other proxies: the leaving squids (still running here, so a request
sent to them would be seen) serve nothing more. A tunnel already open
through a leaving proxy is left to finish (docs/gateway.md, "When a proxy
leaves the fleet").

Real squids, each reaching the site from an address of its own
(tests/support/crawlsite.py), the real service as a process.
"""

from __future__ import annotations

import base64
import random
import socket
import subprocess
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.crawlsite import (
    TOKEN,
    BanningSite,
    Proxy,
    client,
    crawl_service,
    fleet_entries,
    start_proxies,
)
from tests.support.discovery import free_port, proxies, wait_for, write_fleet
from tests.support.postgres import postgres as postgres
from tests.support.squid import EchoServer

pytestmark = pytest.mark.integration

BEFORE = ("home-0", "home-1", "home-2", "home-3")
AFTER = ("home-0-g2", "home-1-g2", "home-2", "home-3")  # home-0 and home-1 recycled
LEAVING = ("home-0", "home-1")


def address_of(text: str) -> str:
    """The proxy address the site saw (`page N for ADDRESS`)."""
    return text.split(" for ")[1].strip()


def curl(port: int, user: str, url: str) -> tuple[int, str]:
    """One request through the gateway with curl (a new connection each time)."""
    done = subprocess.run(
        [
            *("curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "20"),
            *("-x", f"http://{user}:{TOKEN}@127.0.0.1:{port}", url),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


@contextmanager
def tunnel(port: int, user: str, target: str) -> Iterator[socket.socket]:
    """A CONNECT tunnel through the gateway, as a connected socket."""
    credentials = base64.b64encode(f"{user}:{TOKEN}".encode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n"
            % (target.encode(), target.encode(), credentials)
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head
        yield sock


def page_through(sock: socket.socket, page: int) -> str:
    """GET /page/N inside a tunnel to the site (which closes after answering)."""
    sock.sendall(b"GET /page/%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % page)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    return address_of(body.decode())


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_sessions_and_site_sets_leave_a_proxy_that_left_the_fleet_without_an_error(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    db: str | None = None
    if store == "postgres":
        server: Any = request.getfixturevalue("postgres")
        db = server.fresh_database(f"gateway_fleet_{random.randrange(1 << 30)}")
    port = free_port()
    with (
        start_proxies(6) as running,
        BanningSite(limit=1000) as site,
        closing(EchoServer()) as echo,
    ):
        squids = {
            name: Proxy(name, p.address, p.squid)
            for name, p in zip(BEFORE + AFTER[:2], running, strict=True)
        }
        leaving = {squids[name].address for name in LEAVING}
        with (
            crawl_service(
                tmp_path,
                [squids[n] for n in BEFORE],
                extra=["--gateway", f"127.0.0.1:{port}"],
                db=db,
            ) as service,
            client(service) as api,
            httpx.Client(
                proxy=f"http://crawler7-session-a:{TOKEN}@127.0.0.1:{port}", timeout=20
            ) as session,
        ):
            # The session on home-0, the site set of crawler8 on home-1 (never
            # leased proxies first, by name), and a tunnel of the session open.
            first = session.get(f"{site.base}/page/0")
            assert first.status_code == 200
            assert address_of(first.text) == squids["home-0"].address
            status, body = curl(port, "crawler8", f"{site.base}/page/1")
            assert status == 200 and address_of(body) == squids["home-1"].address
            with tunnel(port, "crawler7-session-a", f"127.0.0.1:{echo.port}") as open_tunnel:
                open_tunnel.sendall(b"before")
                assert open_tunnel.recv(6) == b"before"

                # The recycle: the next manifest has home-0-g2 and home-1-g2 in
                # the old ones' place; the old squids still answer.
                write_fleet(tmp_path / "fleet.json", fleet_entries([squids[n] for n in AFTER]))
                wait_for(lambda: set(proxies(api)) == set(AFTER), what="the new fleet")
                served = {address: site.served[address] for address in leaving}

                # The session: 200s, all through one proxy that is not leaving.
                answers = [session.get(f"{site.base}/page/{i}") for i in range(10, 14)]
                assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
                [moved_to] = {address_of(a.text) for a in answers}
                assert moved_to not in leaving
                # A new tunnel of the session leaves through its new proxy.
                with tunnel(port, "crawler7-session-a", site.base.removeprefix("http://")) as sock:
                    assert page_through(sock, 20) == moved_to
                # The site set: 200s, through a proxy that is not leaving.
                for page in range(30, 34):
                    status, body = curl(port, "crawler8", f"{site.base}/page/{page}")
                    assert status == 200, body
                    assert address_of(body) not in leaving
                assert {address: site.served[address] for address in leaving} == served

                # The tunnel opened before the change is left to finish.
                open_tunnel.sendall(b"after")
                assert open_tunnel.recv(5) == b"after"
            metrics = api.get("/metrics").text
            assert "discovery_gateway_upstream_errors_total{" not in metrics  # none tried there
            leased = [n for n, p in proxies(api).items() if p["leased"]]
            assert len(leased) == 2  # the session's and the site set's new leases
        assert site.direct == 0


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_session_on_a_proxy_that_moved_follows_it_to_its_new_address(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    """The same name at a new address (a manifest's `host`/`port` changed): the
    lease is kept, and the session's next request goes to the new address,
    not through the connection the gateway kept to the old one."""
    db: str | None = None
    if store == "postgres":
        server: Any = request.getfixturevalue("postgres")
        db = server.fresh_database(f"gateway_moved_{random.randrange(1 << 30)}")
    port = free_port()
    with start_proxies(3) as running, BanningSite(limit=1000) as site:
        old, other, new = (
            Proxy(n, p.address, p.squid)
            for n, p in zip(("home-0", "home-1", "home-0"), running, strict=True)
        )
        with (
            crawl_service(tmp_path, [old, other], extra=["--gateway", f"127.0.0.1:{port}"], db=db),
            httpx.Client(
                proxy=f"http://crawler7-session-m:{TOKEN}@127.0.0.1:{port}", timeout=20
            ) as session,
        ):
            first = session.get(f"{site.base}/page/0")
            assert first.status_code == 200 and address_of(first.text) == old.address
            write_fleet(tmp_path / "fleet.json", fleet_entries([new, other]))
            log = tmp_path / "service.log"
            wait_for(lambda: "fleet changed" in log.read_text(), what="the moved proxy")
            answers = [session.get(f"{site.base}/page/{i}") for i in range(1, 4)]
            assert [a.status_code for a in answers] == [200] * 3, [a.text for a in answers]
            assert {address_of(a.text) for a in answers} == {new.address}
            assert site.served[old.address] == 1
