"""A client that pipelines requests and never reads the answers (issue 39,
finding 1): `python -m discovery serve` on either store keeps a bounded
number of its requests, closes it once its answers have waited unread for
the write timeout, serves everyone else meanwhile, and its resident memory
stays near where it was. Before, 1 connection with 2.3 MB of `GET /healthz`
grew the service from 66 to 220 MiB, 8 such connections to 1,379 MiB, and
nothing closed them.

The bounds themselves, request by request, are tested on the protocol in
tests/unit/test_discovery_connections.py and over sockets with a tiny cap in
tests/integration/test_discovery_connections.py."""

from __future__ import annotations

import random
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.backpressure import WRITE_TIMEOUT
from tests.support.discovery import (
    ServiceProcess,
    all_healthy,
    free_port,
    proxy_entry,
    wait_for,
    write_fleet,
)
from tests.support.postgres import postgres as postgres
from tests.support.responders import Responders

pytestmark = pytest.mark.integration

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: discovery\r\n\r\n"
ATTACK_BYTES = 2_300_000  # per connection, as in the issue
ATTACKERS = 8
# Resident memory the attack may add to the service, at its peak and once the
# attackers are gone (measured: see docs/discovery.md, "Connections and file
# descriptors"; before the bounds, 8 attackers added about 1,300 MiB).
PEAK_GROWTH_MIB = 40
LEFT_GROWTH_MIB = 25


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class Pipeliner:
    """One connection that sends ATTACK_BYTES of pipelined requests, as fast as the
    service takes them, and reads nothing."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setblocking(False)
        self.data = REQUEST * (ATTACK_BYTES // len(REQUEST))
        self.sent = 0
        self.reset = False

    def push(self) -> None:
        """Sends what the socket takes now; notes a reset by the service."""
        if self.reset or self.sent >= len(self.data):
            return
        try:
            self.sent += self.sock.send(self.data[self.sent : self.sent + 65536])
        except BlockingIOError:
            pass
        except (ConnectionResetError, BrokenPipeError):
            self.reset = True

    def closed_by_service(self) -> bool:
        """Without reading (that would unblock the service): an error or a hang-up."""
        if not self.reset:
            poll = select.poll()
            poll.register(self.sock, select.POLLERR | select.POLLHUP)
            self.reset = bool(poll.poll(0))
        return self.reset


@pytest.fixture
def responders() -> Iterator[Responders]:
    running = Responders.start(1)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_clients_that_pipeline_and_never_read_cost_bounded_memory_and_are_closed(
    tmp_path: Path, request: pytest.FixtureRequest, responders: Responders, store: str
) -> None:
    db = str(tmp_path / "leases.db")
    if store == "postgres":
        server: Any = request.getfixturevalue("postgres")
        db = server.fresh_database(f"pipelining_{random.randrange(1 << 30)}")
    write_fleet(tmp_path / "fleet.json", [proxy_entry("p0", port=responders.ports[0])])
    args = ["--fleet", str(tmp_path / "fleet.json"), "--db", db]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-interval", "0.5"]
    args += ["--probe-target", "127.0.0.1:9"]
    running = ServiceProcess(args, log_path=tmp_path / "service.log").start()
    attackers: list[Pipeliner] = []
    try:
        assert running.process is not None
        pid, port = running.process.pid, int(running.url.rsplit(":", 1)[1])
        with httpx.Client(base_url=running.url, timeout=5) as http:
            wait_for(lambda: all_healthy(http, {"p0"}))
            for _ in range(300):  # what serving costs once, before the attack
                assert http.get("/healthz").status_code == 200
            assert http.get("/metrics").status_code == 200
        time.sleep(1.0)
        baseline = peak = rss_mib(pid)

        attackers = [Pipeliner(port) for _ in range(ATTACKERS)]
        started = time.monotonic()
        served = 0
        next_grant = started
        while time.monotonic() - started < WRITE_TIMEOUT + 40:
            for attacker in attackers:
                attacker.push()
            peak = max(peak, rss_mib(pid))
            if time.monotonic() >= next_grant:  # a crawler, on a new connection each time
                with httpx.Client(base_url=running.url, timeout=5) as crawler:
                    granted = crawler.post("/v1/leases", json={"holder": f"crawler-{served}"})
                    assert granted.status_code == 201, granted.text
                    assert crawler.delete(f"/v1/leases/{granted.json()['id']}").status_code == 204
                served += 1
                next_grant = time.monotonic() + 1.0
            if all(a.closed_by_service() for a in attackers):
                break
            time.sleep(0.02)
        took = time.monotonic() - started
        closed = sum(a.closed_by_service() for a in attackers)
        for attacker in attackers:
            attacker.sock.close()  # the attackers leave
        time.sleep(2.0)
        left = rss_mib(pid)
        with httpx.Client(base_url=running.url, timeout=5) as http:
            metrics = http.get("/metrics").text
            assert http.get("/healthz").status_code == 200
    finally:
        for attacker in attackers:
            attacker.sock.close()
        running.stop()

    figures = f"RSS {baseline:.0f} MiB, {peak:.0f} at the peak, {left:.0f} after; {took:.0f} s"
    assert peak - baseline < PEAK_GROWTH_MIB, figures
    assert closed == ATTACKERS, (
        f"{closed} of {ATTACKERS} attackers closed by the service; {figures}"
    )
    assert left - baseline < LEFT_GROWTH_MIB, figures
    assert served > 0
    line = 'discovery_connections_closed_total{reason="write_timeout"}'
    assert f"{line} {float(ATTACKERS)}" in metrics, [m for m in metrics.splitlines() if line in m]
    assert "Traceback" not in running.log()
