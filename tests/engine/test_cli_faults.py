"""Faults on the way, through the real Pulumi CLI on the testbed: the host's
sshd killed during the base upload, libvirtd restarted while the domains
boot. Each `up` fails with an error that names the host, and the next `up`
converges: the half-uploaded base is fetched again (its lock taken over, no
marker trusted), the domain left running is this stack's and is replaced."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import libvirt
import pytest

from providers.kvm.baselock import STALE_ENV, lock_volume
from proxyinfra.names import base_marker_volume, base_volume, proxy_id
from tests.support.http import FileServer
from tests.support.images import tiny_image
from tests.support.pulumi_cli import CliStack, descendants
from tests.support.testbed import STATE_DIR, URI, Testbed, run_testbed
from tests.support.tinyfleet import pool_volumes, tiny_fleet

# They kill the testbed's own sshd and libvirtd: no other test on it meanwhile.
pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli, pytest.mark.testbed_alone]


def kill_service(name: str, *, with_children: bool) -> None:
    """SIGKILL one of the testbed's daemons, and with `with_children` every
    process it started (sshd's per-connection processes: the provider's
    session with them)."""
    pid = int((STATE_DIR / f"{name}.pid").read_text().split()[0])
    for each in [pid, *(descendants(pid) if with_children else [])]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def test_sshd_killed_during_the_base_upload_then_the_next_up_fetches_again(
    testbed: Testbed, tmp_path: Path
) -> None:
    with FileServer() as server:
        path = f"/{uuid.uuid4().hex[:8]}/tiny.qcow2"
        url = server.add(path, file=tiny_image(), rate=2 * 1024 * 1024)
        stack = CliStack(
            tmp_path / "stack",
            f"ssh{uuid.uuid4().hex[:6]}",
            tiny_fleet(testbed, url),
            extra_env={STALE_ENV: "6"},
        )
        volume = base_volume(url, None, "qcow2")
        try:
            run = stack.start("up", "--yes", "--skip-preview")
            deadline = time.monotonic() + 120
            while volume not in pool_volumes(testbed):
                assert run.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(1.0)
            kill_service("sshd", with_children=True)
            output, _ = run.communicate(timeout=300)
            assert run.returncode != 0
            assert "host 'testbed'" in output, output[-3000:]
            assert base_marker_volume(volume) not in pool_volumes(testbed)
            assert run_testbed("up").returncode == 0  # sshd back

            done = stack.ok("up", "--yes", "--skip-preview")
            assert "its writer is gone; taking over" in done.stdout + done.stderr
            assert server.count(path) == 2  # nothing half-written trusted
            left = pool_volumes(testbed)
            assert base_marker_volume(volume) in left and lock_volume(volume) not in left
            conn = libvirt.open(URI)
            try:
                pid = proxy_id("egress-proxies", stack.stack, "solo-0")
                assert conn.lookupByName(pid).isActive()
            finally:
                conn.close()
        finally:
            run_testbed("up")
            stack.run("destroy", "--yes", "--skip-preview")


def test_libvirtd_restarted_while_the_domain_boots_then_the_next_up_converges(
    testbed: Testbed, tmp_path: Path
) -> None:
    with FileServer() as server:
        url = server.add(f"/{uuid.uuid4().hex[:8]}/tiny.qcow2", file=tiny_image())
        stack = CliStack(tmp_path / "stack", f"lvd{uuid.uuid4().hex[:6]}", tiny_fleet(testbed, url))
        pid = proxy_id("egress-proxies", stack.stack, "solo-0")
        try:
            run = stack.start("up", "--yes", "--skip-preview")
            deadline = time.monotonic() + 300
            while True:
                conn = libvirt.open(URI)
                try:
                    names = {d.name() for d in conn.listAllDomains(0)}
                finally:
                    conn.close()
                if pid in names:
                    break
                assert run.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            kill_service("libvirtd", with_children=False)  # the guests keep running
            assert run_testbed("up").returncode == 0  # libvirtd back, the guest still runs
            output, _ = run.communicate(timeout=600)
            if run.returncode != 0:  # failed, naming the host; else it reconnected
                assert "host 'testbed'" in output, output[-3000:]
            stack.ok("up", "--yes", "--skip-preview")
            stack.ok("preview", "--expect-no-changes")
            conn = libvirt.open(URI)
            try:
                assert conn.lookupByName(pid).isActive()
                assert sum(d.name() == pid for d in conn.listAllDomains(0)) == 1
            finally:
                conn.close()
        finally:
            run_testbed("up")
            stack.run("destroy", "--yes", "--skip-preview")
