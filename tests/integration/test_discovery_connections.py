"""Connections that hold the service's descriptors without finishing a request
(discovery/connections.py): idle sockets, half-sent requests, oversized heads,
a connection cap below RLIMIT_NOFILE, and a graceful stop with half-sent
requests.

The first two tests run `python -m discovery serve` as operators do, under
`ulimit -n 1024` (systemd's default), with fake CONNECT proxies
(tests/support/responders.py) for the health engine to probe. The others
run uvicorn with the service's protocol and a tiny cap in a thread, against
a small app whose slowness the test controls.
"""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from discovery.backpressure import WRITE_TIMEOUT
from discovery.connections import (
    KEEP_ALIVE,
    REQUEST_TIMEOUT,
    ConnectionGuard,
    connection_cap,
    protocol_class,
)
from tests.support.discovery import (
    ROOT,
    ServiceProcess,
    all_healthy,
    free_port,
    proxies,
    proxy_entry,
    wait_for,
    write_fleet,
)

pytestmark = pytest.mark.integration

FD_LIMIT = 1024  # what a systemd service gets unless its unit says otherwise
HEALTH_WORKERS = 256  # the service's default
HEAD = b"POST /v1/leases HTTP/1.1\r\nHost: discovery\r\n"
HALF_HEAD = HEAD + b"Content-Le"
HALF_BODY = HEAD + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"hol'


@pytest.fixture(autouse=True)
def enough_descriptors_here() -> Iterator[None]:
    """This process holds over a thousand sockets at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if wanted < 2048:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is too low for this test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextmanager
def fake_proxies(count: int) -> Iterator[list[int]]:
    """CONNECT responders answering 200 on `count` loopback ports, in a process of their own."""
    responders = subprocess.Popen(
        [sys.executable, "-m", "tests.support.responders", "--ports", str(count)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert responders.stdin is not None and responders.stdout is not None
    try:
        yield json.loads(responders.stdout.readline())
    finally:
        responders.stdin.close()
        responders.wait(timeout=10)


def service(tmp_path: Path, ports: list[int]) -> ServiceProcess:
    write_fleet(
        tmp_path / "fleet.json", [proxy_entry(f"p{i}", port=p) for i, p in enumerate(ports)]
    )
    args = ["--fleet", str(tmp_path / "fleet.json"), "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-interval", "0.5"]
    args += ["--probe-target", "127.0.0.1:9", "--health-workers", str(HEALTH_WORKERS)]
    return ServiceProcess(
        args,
        log_path=tmp_path / "service.log",
        env={"EGRESS_PROXIES_LOG": "info"},
        fd_limit=FD_LIMIT,
    )


def connect(port: int, send: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if send:
        sock.sendall(send)
    return sock


def reset_by_peer(sock: socket.socket) -> bool:
    """True once the peer has reset the connection, found without reading (reading
    would unblock a peer that waits for this side to read)."""
    poll = select.poll()
    poll.register(sock, select.POLLERR | select.POLLHUP)
    return bool(poll.poll(0))


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the peer has closed (EOF or reset); what it sent before is read and dropped."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # not select(): these descriptors run past 1024
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        sock.settimeout(timeout)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in the metrics")


# -- the service under `ulimit -n 1024` ------------------------------------------------------


def test_idle_and_half_sent_connections_leave_probes_and_grants_working(tmp_path: Path) -> None:
    with fake_proxies(4) as ports:
        running = service(tmp_path, ports).start()
        held: list[socket.socket] = []
        try:
            port = int(running.url.rsplit(":", 1)[1])
            names = {f"p{i}" for i in range(len(ports))}
            with httpx.Client(base_url=running.url, timeout=5) as client:
                wait_for(lambda: all_healthy(client, names))
            # More idle sockets than the service has descriptors, and half-sent requests.
            held += [connect(port) for _ in range(1100)]
            held += [connect(port, HALF_HEAD) for _ in range(50)]
            held += [connect(port, HALF_BODY) for _ in range(50)]
            started = time.monotonic()
            rounds = 0
            while time.monotonic() - started < 4.0:  # eight probe intervals
                # A new connection each round: it must find room at the cap.
                with httpx.Client(base_url=running.url, timeout=5) as client:
                    granted = client.post("/v1/leases", json={"holder": f"crawler-{rounds}"})
                    assert granted.status_code == 201, granted.text
                    assert client.delete(f"/v1/leases/{granted.json()['id']}").status_code == 204
                    assert all_healthy(client, names), proxies(client)
                rounds += 1
                time.sleep(0.2)
            with httpx.Client(base_url=running.url, timeout=5) as client:
                metrics = client.get("/metrics").text
            cap = connection_cap(FD_LIMIT, HEALTH_WORKERS)
            assert metric(metrics, "discovery_connections_max") == cap
            assert metric(metrics, "discovery_connections_open") <= cap
            assert metric(metrics, 'discovery_connections_closed_total{reason="evicted"}') > 0
            assert metric(metrics, 'egress_health_probes_total{outcome="local"}') == 0
            # Whatever is still held is closed by the service once the request timeout is up.
            deadline = time.monotonic() + REQUEST_TIMEOUT + 5
            while time.monotonic() < deadline and not all(closed_by_peer(s) for s in held):
                time.sleep(0.2)
            still_open = sum(not closed_by_peer(s) for s in held)
            assert still_open == 0, f"{still_open} of {len(held)} sockets still open"
            with httpx.Client(base_url=running.url, timeout=5) as client:
                assert all_healthy(client, names)
        finally:
            for sock in held:
                sock.close()
            running.stop()
    log = running.log()
    assert "Too many open files" not in log and "unhealthy" not in log, log[-3000:]
    assert "Traceback" not in log


def test_a_graceful_stop_with_half_sent_requests_logs_no_traceback(tmp_path: Path) -> None:
    with fake_proxies(1) as ports:
        running = service(tmp_path, ports).start()
        port = int(running.url.rsplit(":", 1)[1])
        held = [connect(port, HALF_HEAD if i % 2 else HALF_BODY) for i in range(500)]
        try:
            time.sleep(1.0)  # every request read as far as it goes
            started = time.monotonic()
            assert running.terminate(timeout=30) == 0
            stopped_in = time.monotonic() - started
        finally:
            for sock in held:
                sock.close()
            running.stop()
    log = running.log()
    tracebacks = sum("Traceback" in line for line in log.splitlines())
    assert tracebacks == 0, log[-3000:]
    assert "CancelledError" not in log
    assert stopped_in < 5.0, f"the stop took {stopped_in:.1f} s"


# -- the protocol in a thread, with a tiny cap -----------------------------------------------


BIG_ANSWER = 16 * 1024 * 1024  # more than the kernel's socket buffers hold


class SlowApp:
    """200 "ok" for any request; requests to /slow wait until `release` is set;
    /big is answered with BIG_ANSWER bytes."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body", False):
            pass
        if scope["path"] == "/slow":
            self.started += 1
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        body = b"b" * BIG_ANSWER if scope["path"] == "/big" else b"ok"
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@contextmanager
def guarded_server(
    max_connections: int,
    request_timeout: float = REQUEST_TIMEOUT,
    write_timeout: float = WRITE_TIMEOUT,
) -> Iterator[tuple[int, ConnectionGuard, SlowApp]]:
    app = SlowApp()
    guard = ConnectionGuard(
        max_connections=max_connections,
        registry=CollectorRegistry(),
        request_timeout=request_timeout,
        write_timeout=write_timeout,
    )
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=protocol_class(guard),
        timeout_keep_alive=KEEP_ALIVE,
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    try:
        yield port, guard, app
    finally:
        app.release.set()
        server.should_exit = True
        thread.join(timeout=15)


def closed(guard: ConnectionGuard, reason: str) -> float | None:
    return guard.registry.get_sample_value("discovery_connections_closed_total", {"reason": reason})


def answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        if b"\r\n\r\n" in data and data.endswith((b"ok", b"}")):
            break
    return data


def get(path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def test_at_the_cap_the_longest_waiting_connection_makes_room() -> None:
    with guarded_server(max_connections=4) as (port, guard, _):
        oldest, *others = [connect(port, HALF_HEAD if i % 2 else b"") for i in range(4)]
        time.sleep(0.2)
        fresh = connect(port, get())
        assert answer(fresh).startswith(b"HTTP/1.1 200 "), "the new connection was not served"
        wait_for(lambda: closed_by_peer(oldest), timeout=2)
        assert not any(closed_by_peer(s) for s in others)
        assert (
            closed(guard, "evicted") == 1
            and guard.registry.get_sample_value("discovery_connections_refused_total") == 0
        )


def test_at_the_cap_with_every_connection_busy_new_ones_get_503() -> None:
    with guarded_server(max_connections=4) as (port, guard, app):
        busy = [connect(port, get("/slow")) for _ in range(4)]
        wait_for(lambda: app.started == 4)
        refused = connect(port)  # answered at once, before it sends anything
        head = answer(refused)
        assert head.startswith(b"HTTP/1.1 503 "), head
        assert b"retry-after: 1\r\n" in head.lower() and b'"error": "overloaded"' in head
        wait_for(lambda: closed_by_peer(refused), timeout=2)
        app.release.set()
        assert all(answer(s).startswith(b"HTTP/1.1 200 ") for s in busy)
        assert guard.registry.get_sample_value("discovery_connections_refused_total") == 1
        later = connect(port, get())  # the busy ones now wait for their next request
        assert answer(later).startswith(b"HTTP/1.1 200 ")


def test_a_request_must_arrive_whole_within_the_request_timeout() -> None:
    with guarded_server(max_connections=100, request_timeout=0.5) as (port, guard, _):
        idle, half_head, half_body = (
            connect(port),
            connect(port, HALF_HEAD),
            connect(port, HALF_BODY),
        )
        trickle = connect(port)
        # A keep-alive client, quick enough: served twice on one connection.
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            assert client.get("/").status_code == 200
            time.sleep(0.3)
            assert client.get("/").status_code == 200
        started = time.monotonic()
        for byte in get()[:-1]:  # one byte at a time, never finishing the head
            try:
                trickle.send(bytes([byte]))
            except OSError as exc:
                assert exc.errno in (errno.EPIPE, errno.ECONNRESET)
                break
            if closed_by_peer(trickle):
                break
            time.sleep(0.05)
        assert closed_by_peer(trickle)
        assert time.monotonic() - started < 1.5
        for sock in (idle, half_head, half_body):
            assert closed_by_peer(sock)
        assert closed(guard, "request_timeout") == 4


def test_a_head_over_64_kib_gets_431() -> None:
    with guarded_server(max_connections=100) as (port, guard, _):
        big = connect(port)
        big.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(100):
                big.sendall(b"X-Filler: " + b"f" * 1000 + b"\r\n")
        except OSError:
            pass  # closed while sending: the answer is already there
        head = answer(big)
        assert head.startswith(b"HTTP/1.1 431 "), head[:200]
        assert closed(guard, "head_too_large") == 1
        # A body of 64 KiB in the same write as its head is no head too large.
        body = b"b" * 65536
        normal = connect(port, HEAD + b"Content-Length: 65536\r\n\r\n" + body)
        assert answer(normal).startswith(b"HTTP/1.1 200 ")


def filled_head(headers: int) -> bytes:
    """A complete GET head with `headers` headers of about 1 KB each."""
    filler = b"".join(b"X-Filler-%03d: " % i + b"f" * 1000 + b"\r\n" for i in range(headers))
    return b"GET / HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n"


def test_a_head_over_64_kib_in_one_write_gets_431_too() -> None:
    """The limit is the head's, however many reads bring it: 70 KB sent at once
    (often one read) is refused as 200 KB sent in pieces is."""
    with guarded_server(max_connections=100) as (port, guard, _):
        big = connect(port, filled_head(70))
        head = answer(big)
        assert head.startswith(b"HTTP/1.1 431 "), head[:200]
        assert closed(guard, "head_too_large") == 1
        wait_for(lambda: closed_by_peer(big), timeout=5)
        fits = connect(port, filled_head(60))
        assert answer(fits).startswith(b"HTTP/1.1 200 ")
        assert closed(guard, "head_too_large") == 1


# -- answers nobody reads (discovery/backpressure.py) ----------------------------------------


def test_a_connection_whose_answers_are_not_read_is_reset_after_the_write_timeout() -> None:
    # One second: the reader below shares this process (and its GIL) with the
    # server's thread, and on a loaded machine a half-second stall of both was
    # seen to pass for a reader that stopped (a fresh machine's first run, two
    # Go builds beside the tests).
    timeout = 1.0
    with guarded_server(max_connections=100, write_timeout=timeout) as (port, guard, _):
        unread = connect(port, get("/big"))
        wait_for(lambda: reset_by_peer(unread), timeout=5)
        assert closed(guard, "write_timeout") == 1
        # A client that reads gets the whole answer, however long it takes past the
        # timeout: 16 MiB at about 6 MiB/s at most, read by read.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as reader:
            reader.sendall(get("/big"))
            received, started = 0, time.monotonic()
            while received < BIG_ANSWER:
                received += len(reader.recv(65536))
                time.sleep(0.01)
            assert time.monotonic() - started > 2 * timeout
        assert closed(guard, "write_timeout") == 1


def test_at_the_cap_with_none_idle_a_connection_whose_answers_are_unread_makes_room() -> None:
    with guarded_server(max_connections=4) as (port, guard, _):
        unread = [connect(port, get("/big")) for _ in range(4)]
        wait_for(lambda: len(guard.stalled) == 4, timeout=5)
        fresh = connect(port, get())
        assert answer(fresh).startswith(b"HTTP/1.1 200 "), "the new connection was not served"
        assert sum(reset_by_peer(s) for s in unread) == 1
        assert closed(guard, "evicted") == 1
        assert guard.registry.get_sample_value("discovery_connections_refused_total") == 0
