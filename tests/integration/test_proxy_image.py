"""The proxy image of scripts/build-proxy-image, proved end to end: built (or
taken from its cache), served over HTTP, one proxy brought up on the testbed by
the stack program in hybrid mode, squid configured by cloud-init from the seed
and answering, a page fetched through it with the manifest's credentials, a
wrong password refused, and nothing of the proxy left after the destroy.

Prints the time of each stage (run with -s to see them as they happen).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import libvirt
import libvirt_qemu
import pytest
import yaml

from health.probe import connect_request, parse_status
from proxyinfra.names import overlay_volume, proxy_id, seed_volume
from tests.harness.program import ProgramResult, run_program
from tests.support.http import FileServer
from tests.support.images import proxy_image
from tests.support.testbed import URI, Testbed

pytestmark = pytest.mark.integration

STACK_PREFIX = "img"
USERNAME = "crawler"
SQUID_TIMEOUT = 180.0  # from the domain's address to squid answering
PAGE = b"egress-proxies: a page fetched through the proxy image\n"


# -- a page server on the testbed network's gateway ------------------------------------------


class PageServer:
    """HTTP on the host's address in the VM network; remembers who asked."""

    def __init__(self, host: str) -> None:
        self.clients: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.clients.append(self.client_address[0])
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(PAGE)))
                self.end_headers()
                self.wfile.write(PAGE)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def target(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


# -- talking to squid ------------------------------------------------------------------------


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} bytes of the answer")
        data += chunk
    return data


def connect_status(
    ip: str, port: int, target: str, username: str | None, password: str | None
) -> int:
    with socket.create_connection((ip, port), timeout=10) as sock:
        sock.sendall(connect_request(target, username, password))
        return parse_status(_read_head(sock))[0]


def fetch_through(
    ip: str, port: int, target: str, username: str, password: str
) -> tuple[int, bytes]:
    """CONNECT to target, then GET / through the tunnel: (CONNECT status, page body)."""
    with socket.create_connection((ip, port), timeout=20) as sock:
        sock.sendall(connect_request(target, username, password))
        head = _read_head(sock)
        status = parse_status(head)[0]
        if status != 200:
            return status, b""
        rest = head.split(b"\r\n\r\n", 1)[1]
        sock.sendall(f"GET / HTTP/1.0\r\nHost: {target}\r\n\r\n".encode())
        answer = rest
        while chunk := sock.recv(65536):
            answer += chunk
    page_head, _, body = answer.partition(b"\r\n\r\n")
    assert page_head.startswith(b"HTTP/1.0 200"), page_head
    return status, body


def wait_for_squid(ip: str, port: int, target: str, deadline: float) -> int | None:
    """Polls until squid answers a CONNECT without credentials; its status, or None."""
    while time.monotonic() < deadline:
        try:
            return connect_status(ip, port, target, None, None)
        except OSError:  # refused (not started yet), reset, timed out
            time.sleep(1)
    return None


# -- the guest agent (diagnostics and cloud-init's own timing) -------------------------------


def guest_run(dom: Any, *argv: str, timeout: float = 30) -> str:
    """Runs a command in the guest through qemu-guest-agent; its output (or the error)."""
    try:
        started = json.loads(
            libvirt_qemu.qemuAgentCommand(
                dom,
                json.dumps(
                    {
                        "execute": "guest-exec",
                        "arguments": {
                            "path": argv[0],
                            "arg": list(argv[1:]),
                            "capture-output": True,
                        },
                    }
                ),
                10,
                0,
            )
        )
        pid = started["return"]["pid"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = json.loads(
                libvirt_qemu.qemuAgentCommand(
                    dom,
                    json.dumps({"execute": "guest-exec-status", "arguments": {"pid": pid}}),
                    10,
                    0,
                )
            )["return"]
            if status["exited"]:
                out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
                err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
                return out + err
            time.sleep(0.5)
        return f"({' '.join(argv)}: still running after {timeout:.0f}s)"
    except (libvirt.libvirtError, KeyError, ValueError) as exc:
        return f"({' '.join(argv)}: guest agent: {exc})"


def guest_diagnostics(dom: Any) -> str:
    commands = [
        ("cloud-init", "status", "--long"),
        ("systemctl", "--no-pager", "status", "squid"),
        ("sh", "-c", "grep -E 'WARNING|ERROR|Traceback' /var/log/cloud-init.log | tail -n 30"),
        ("tail", "-n", "40", "/var/log/cloud-init-output.log"),
        ("ip", "-br", "addr"),
    ]
    return "\n".join(f"$ {' '.join(c)}\n{guest_run(dom, *c)}" for c in commands)


# -- the test ----------------------------------------------------------------------------------


def proxy_config(testbed: Testbed, image_url: str) -> dict[str, Any]:
    provider = yaml.safe_load(testbed.provider_yaml.read_text())
    provider["kvm"]["images"] = {"proxy": {"url": image_url}}
    provider["kvm"]["machineTypes"] = {"small": {"cpus": 1, "memoryMb": 512}}
    provider["kvm"]["ipTimeoutSeconds"] = 240
    return {
        "providers": [provider],
        "proxies": [
            {
                "name": "edge",
                "provider": provider["name"],
                "replicas": 1,
                "placement": {"machineType": "small", "image": "proxy"},
            }
        ],
        "squid": {
            "allowedClients": [str(testbed.subnet)],
            "connectPorts": ["1-65535"],
            # The page server is on the gateway, a private address squid refuses by default.
            "blockedDestinations": [],
            "auth": {"username": USERNAME},
        },
    }


class Stages:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float]] = []

    def add(self, what: str, seconds: float) -> None:
        self.rows.append((what, seconds))
        print(f"stage: {what}: {seconds:.1f}s", flush=True)

    def table(self) -> str:
        return "\n".join(f"  {what:<52} {seconds:7.1f}s" for what, seconds in self.rows)


def _seconds(pattern: str, log: str) -> float | None:
    found = re.search(pattern, log)
    return float(found.group(1)) if found else None


def _leftovers(conn: Any, testbed: Testbed, pid: str) -> list[str]:
    left = [f"domain {pid}"] if pid in {d.name() for d in conn.listAllDomains(0)} else []
    pool = conn.storagePoolLookupByName(testbed.pool)
    pool.refresh(0)
    volumes = {v.name() for v in pool.listAllVolumes(0)}
    return left + [f"volume {v}" for v in (overlay_volume(pid), seed_volume(pid)) if v in volumes]


def _remove(conn: Any, testbed: Testbed, pid: str) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        dom = conn.lookupByName(pid)
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    pool = conn.storagePoolLookupByName(testbed.pool)
    for name in (overlay_volume(pid), seed_volume(pid)):
        with contextlib.suppress(libvirt.libvirtError):
            pool.storageVolLookupByName(name).delete(0)


@pytest.fixture
def conn() -> Iterator[Any]:
    libvirt.registerErrorHandler(lambda *a: None, None)
    c = libvirt.open(URI)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.timeout(2400)  # a build from nothing takes minutes; cached, the test about four (TCG)
def test_proxy_image_serves_a_page_through_squid(
    testbed: Testbed, conn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = Stages()
    image = proxy_image()
    stages.add(f"image build ({'cached' if image.cached else 'built'})", image.seconds)
    if not image.cached:
        print(image.log)

    stack = f"{STACK_PREFIX}{uuid.uuid4().hex[:6]}"
    pid = proxy_id("egress-proxies", stack, "edge-0")
    state = tmp_path / "state.json"
    up: ProgramResult | None = None
    diagnostics = ""
    files = FileServer()
    config = proxy_config(testbed, files.add(f"/{stack}/debian-proxy.qcow2", file=image.path))
    try:
        with files, PageServer(str(testbed.gateway)) as page:
            started = time.monotonic()
            up = run_program(
                "proxyinfra.program:main",
                config,
                stack=stack,
                hybrid=True,
                mode="up",
                state_file=state,
                timeout=900,
                rpc_timeout=600,  # above ipTimeoutSeconds: the domain's create waits that long
            )
            up_done = time.monotonic()
            assert up.error is None, f"{up.error}\n{up.provider_log[-4000:]}"
            stages.add("pulumi up (hybrid), all resources", up_done - started)
            fetched = _seconds(
                r"base image fetched into host pool .* in ([\d.]+) s", up.provider_log
            )
            to_ip = _seconds(r"domain has address \S+ after ([\d.]+)s", up.provider_log)
            assert fetched is not None and to_ip is not None, up.provider_log[-4000:]
            stages.add("download into the pool", fetched)
            stages.add("boot to IP (domain start to DHCP lease)", to_ip)

            proxy = up.output("fleet")["proxies"][0]
            ip, port, password = proxy["host"], proxy["port"], proxy["auth"]["password"]
            assert proxy["auth"]["username"] == USERNAME and password

            # cloud-init writes squid.conf and the password file, then (re)starts squid.
            status = wait_for_squid(ip, port, page.target, up_done + SQUID_TIMEOUT)
            answered = time.monotonic()
            dom = conn.lookupByName(pid)
            if status is None:
                diagnostics = guest_diagnostics(dom)
            assert status == 407, (
                f"squid on {ip}:{port} did not ask for credentials within {SQUID_TIMEOUT:.0f}s "
                f"of the address (answer: {status})\n{diagnostics}"
            )
            stages.add("squid answering (since domain start)", answered - up_done + to_ip)
            # squid answers a moment before cloud-init writes its final message.
            status_text = guest_run(dom, "cloud-init", "status", "--long", "--wait", timeout=120)
            print(status_text)
            assert "status: done" in status_text, f"{status_text}\n{guest_diagnostics(dom)}"
            output = guest_run(dom, "cat", "/var/log/cloud-init-output.log")
            up_at = _seconds(r"finished at .* Up ([\d.]+) seconds", output)
            if up_at is not None:
                stages.add("cloud-init finished (guest uptime)", up_at)

            before = time.monotonic()
            connect, body = fetch_through(ip, port, page.target, USERNAME, password)
            stages.add("CONNECT + page through the proxy", time.monotonic() - before)
            assert connect == 200
            assert body == PAGE
            assert page.clients == [ip], "the page server should see the VM's address"
            assert connect_status(ip, port, page.target, USERNAME, password + "x") == 407
            assert connect_status(ip, port, page.target, "nobody", password) == 407
    finally:
        destroyed = ""
        if state.exists() and json.loads(state.read_text()).get("resources"):
            before = time.monotonic()
            down = run_program(
                "proxyinfra.program:main",
                config,
                stack=stack,
                hybrid=True,
                mode="destroy",
                state_file=state,
                timeout=600,
                rpc_timeout=300,
            )
            stages.add("pulumi destroy (hybrid)", time.monotonic() - before)
            if down.destroy_error is not None:
                destroyed = f"{down.destroy_error}\n{down.provider_log[-4000:]}"
        left = _leftovers(conn, testbed, pid)
        if left:
            _remove(conn, testbed, pid)  # the testbed is shared: never leave a VM running
        with capsys.disabled():
            print(f"\nproxy image {image.path.name}: stages\n{stages.table()}")

    assert not destroyed, destroyed
    assert left == [], "the destroy left these behind (removed now)"
