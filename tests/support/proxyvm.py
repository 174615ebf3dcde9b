"""Around proxy VMs on the testbed: an HTTPS page server on the VM network
that remembers who asked, CONNECT through squid at the socket level, the
guest agent for diagnostics, what a destroy left on the host, and stage
timings."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import libvirt
import libvirt_qemu
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxyinfra.names import overlay_volume, seed_volume
from tests.support.pulumi_cli import CliStack
from tests.support.squid import connect_status
from tests.support.stack_config import image, machine_type, the_testbed_provider
from tests.support.testbed import Testbed, refresh_pool

PAGE = b"egress-proxies: a page fetched through a proxy VM\n"


# -- the page server ---------------------------------------------------------------------------


def self_signed(ip: str, directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for `ip` (cert, key), so the crawler verifies TLS for real."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress-proxies test page")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "page.crt", directory / "page.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class PageServer:
    """HTTP (or HTTPS with `tls`) on `host`; `clients` lists who asked for the
    page, in order, `peers` every address that connected."""

    def __init__(self, host: str, tls: tuple[Path, Path] | None = None) -> None:
        self.clients: list[str] = []  # who sent a GET
        self.peers: set[str] = set()  # who connected at all (health probes too)
        self._accepted = threading.Condition()
        self.scheme = "https" if tls else "http"
        self._host = host
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

        class Server(ThreadingHTTPServer):
            def get_request(self) -> tuple[socket.socket, Any]:
                sock, address = super().get_request()
                with owner._accepted:
                    owner.peers.add(address[0])
                    owner._accepted.notify_all()
                return sock, address

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # health probes connect and leave without a TLS handshake

        self._httpd = Server((host, 0), Handler)
        self._httpd.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            # Handshake in the handler thread, not in accept: a health probe
            # that connects and closes must not stall the server.
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def saw(self, address: str, timeout: float = 30.0) -> bool:
        """Whether ADDRESS connected (now, or within TIMEOUT). A proxy answers
        a CONNECT once the kernel took its connection, which may be before
        this server's thread accepted it."""
        with self._accepted:
            return self._accepted.wait_for(lambda: address in self.peers, timeout)

    @property
    def target(self) -> str:
        """host:port, what a CONNECT names."""
        return f"{self._host}:{self._httpd.server_port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.target}/"

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def proxy_vm_provider(testbed: Testbed, image_url: str, sha256: str) -> dict[str, Any]:
    """The testbed's kvm provider entry for VMs of the proxy image at
    `image_url` (machine type `small`, image `proxy`)."""
    return the_testbed_provider(
        testbed,
        # With its digest the base is named by content: cached on the host across runs.
        images={"proxy": image(image_url, sha256)},
        machine_types={"small": machine_type(1, 512)},
        ip_timeout=300,  # cloud-init under TCG
    )


# -- squid at the socket level -----------------------------------------------------------------


def wait_for_squid(ip: str, port: int, target: str, deadline: float) -> int | None:
    """Polls until squid answers a CONNECT without credentials; its status, or None."""
    while time.monotonic() < deadline:
        try:
            return connect_status(ip, port, target)
        except OSError:  # refused (not started yet), reset, timed out
            time.sleep(1)
    return None


# -- the guest agent (diagnostics and cloud-init's own timing) -------------------------------


def _agent(dom: Any, command: dict[str, Any]) -> Any:
    return json.loads(libvirt_qemu.qemuAgentCommand(dom, json.dumps(command), 10, 0))["return"]


def guest_run(dom: Any, *argv: str, timeout: float = 30) -> str:
    """Runs a command in the guest through qemu-guest-agent; its output (or the error)."""
    try:
        pid = _agent(
            dom,
            {
                "execute": "guest-exec",
                "arguments": {"path": argv[0], "arg": list(argv[1:]), "capture-output": True},
            },
        )["pid"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = _agent(dom, {"execute": "guest-exec-status", "arguments": {"pid": pid}})
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


# -- the host after a destroy ------------------------------------------------------------------


def pool_volumes(conn: Any, testbed: Testbed) -> set[str]:
    pool = conn.storagePoolLookupByName(testbed.pool)
    refresh_pool(pool)
    return {v.name() for v in pool.listAllVolumes(0)}


def leftovers(conn: Any, testbed: Testbed, ids: list[str]) -> list[str]:
    """The domains, overlays and seeds of these proxies still on the host."""
    domains = {d.name() for d in conn.listAllDomains(0)}
    volumes = pool_volumes(conn, testbed)
    left = [f"domain {pid}" for pid in ids if pid in domains]
    for pid in ids:
        left += [f"volume {v}" for v in (overlay_volume(pid), seed_volume(pid)) if v in volumes]
    return left


def remove(conn: Any, testbed: Testbed, ids: list[str]) -> None:
    """Removes what a failed destroy left: the testbed is shared, never leave a VM running."""
    pool = conn.storagePoolLookupByName(testbed.pool)
    for pid in ids:
        with contextlib.suppress(libvirt.libvirtError):
            dom = conn.lookupByName(pid)
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        for name in (overlay_volume(pid), seed_volume(pid)):
            with contextlib.suppress(libvirt.libvirtError):
                pool.storageVolLookupByName(name).delete(0)


def destroy_and_clean(
    stack: CliStack, conn: Any, testbed: Testbed, ids: list[str], stages: Stages
) -> tuple[str, list[str]]:
    """`pulumi destroy` of what the stack holds, then removal of what it left
    (the testbed is shared): the destroy's failure output ("" when it
    succeeded) and what was left before the removal."""
    destroyed = ""
    if stack.resources():
        before = time.monotonic()
        down = stack.run("destroy", "--yes", "--skip-preview", timeout=600)
        stages.add("pulumi destroy (the CLI)", time.monotonic() - before)
        if down.returncode != 0:
            destroyed = f"{down.stdout[-3000:]}\n{down.stderr[-2000:]}"
    left = leftovers(conn, testbed, ids)
    if left:
        remove(conn, testbed, ids)
    return destroyed, left


# -- stage timings -----------------------------------------------------------------------------


class Stages:
    """What each stage took, printed as it ends (past pytest's capture, so CI
    logs show it on success too) and as a table at the end."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.rows: list[tuple[str, float]] = []
        self._capsys = capsys

    def add(self, what: str, seconds: float) -> None:
        self.rows.append((what, seconds))
        self.show(f"stage: {what}: {seconds:.1f}s")

    def show(self, text: str) -> None:
        with self._capsys.disabled():
            print(text, flush=True)

    def table(self) -> str:
        return "\n".join(f"  {what:<56} {seconds:7.1f}s" for what, seconds in self.rows)
