"""SSH-forwarded libvirt against the testbed's real sshd, libvirtd and qemu."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import libvirt
import pytest

from providers.kvm.connection import HostConnection
from providers.kvm.errors import (
    AuthenticationRefused,
    HostKeyMismatch,
    HostKeyUnknown,
    HostUnreachable,
    KeyFileError,
    LibvirtSocketError,
)
from tests.support.sshd import PrivateSshd
from tests.support.testbed import Testbed, access_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def connection(testbed: Testbed) -> Iterator[HostConnection]:
    conn = HostConnection(access_for(testbed))
    yield conn
    conn.close()


def test_libvirt_over_ssh_as_the_non_root_user(
    connection: HostConnection, testbed: Testbed
) -> None:
    conn = connection.libvirt()
    assert connection.ssh().access.user != "root"
    assert testbed.pool in [p.name() for p in conn.listAllStoragePools(0)]
    pool = conn.storagePoolLookupByName(testbed.pool)
    name = f"transport-test-{uuid.uuid4().hex[:8]}.raw"
    payload = os.urandom(3 * 1024 * 1024 + 17)
    vol = pool.createXML(
        f"<volume><name>{name}</name><capacity>{len(payload)}</capacity>"
        "<target><format type='raw'/></target></volume>",
        0,
    )
    try:
        stream = conn.newStream(0)
        vol.upload(stream, 0, len(payload), 0)
        for i in range(0, len(payload), 256 * 1024):
            stream.send(payload[i : i + 256 * 1024])
        stream.finish()
        back = bytearray()
        stream = conn.newStream(0)
        vol.download(stream, 0, len(payload), 0)
        while chunk := stream.recv(256 * 1024):
            if isinstance(chunk, int):  # -2: would block; not in blocking mode
                continue
            back += chunk
        stream.finish()
        assert bytes(back) == payload
    finally:
        vol.delete(0)
    assert name not in [v.name() for v in pool.listAllVolumes(0)]


def test_define_start_destroy_undefine_a_domain(
    connection: HostConnection, testbed: Testbed
) -> None:
    conn = connection.libvirt()
    name = f"testbed-transport-{uuid.uuid4().hex[:8]}"
    xml = f"""<domain type='qemu'>
      <name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
      <os><type arch='x86_64' machine='q35'>hvm</type></os>
      <cpu mode='maximum'/>
      <devices><interface type='network'><source network='{testbed.network}'/><model type='virtio'/></interface>
      <serial type='pty'/></devices></domain>"""
    dom = conn.defineXML(xml)
    try:
        dom.create()
        assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        dom.destroy()
        assert dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF
    finally:
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    assert name not in [d.name() for d in conn.listAllDomains(0)]


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_reconnects_after_sshd_dies_and_fails_clearly_while_down(
    testbed: Testbed, tmp_path: Path
) -> None:
    sshd = PrivateSshd(testbed.sshd_config, testbed.known_hosts, tmp_path).start()
    conn = HostConnection(
        access_for(testbed, port=sshd.port, known_hosts_file=str(sshd.known_hosts))
    )
    try:
        assert conn.libvirt().getLibVersion() > 0
        assert conn.opened == 1
        assert sshd.kill_sessions() >= 1  # the session dies under us
        wait_until(lambda: not conn.alive, "the dropped session to be noticed")
        assert conn.libvirt().getLibVersion() > 0  # the next call reconnects
        assert conn.opened == 2
        sshd.stop()
        gc.collect()
        # A call while the kill is still on its way fails with libvirt's own
        # error (never retried mid-call); the one after it is noticed reconnects.
        wait_until(lambda: not conn.alive, "the stopped server's session to be noticed")
        with pytest.raises(HostUnreachable) as info:
            conn.libvirt().getLibVersion()
        text = str(info.value)
        assert f"127.0.0.1:{sshd.port}" in text and "Connection refused" in text
        assert "check the address and port" in text
        sshd.start()
        assert conn.libvirt().getLibVersion() > 0
        assert conn.opened == 3
    finally:
        conn.close()
        sshd.stop()


def test_host_keys_verified(
    testbed: Testbed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(f"[127.0.0.1]:{testbed.ssh_port} {other.with_suffix('.pub').read_text()}")
    with pytest.raises(HostKeyMismatch) as mismatch:
        HostConnection(access_for(testbed, known_hosts_file=str(wrong))).libvirt()
    assert "host key changed: offered ssh-ed25519 SHA256:" in str(mismatch.value)
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    with pytest.raises(HostKeyUnknown) as unknown:
        HostConnection(access_for(testbed, known_hosts_file=str(empty))).libvirt()
    assert f"ssh-keyscan -p {testbed.ssh_port} 127.0.0.1 >> {empty}" in str(unknown.value)

    caplog.set_level(logging.WARNING, logger="kvm")
    insecure = HostConnection(
        access_for(
            testbed,
            known_hosts_file=str(empty),
            insecure_ignore_host_key=True,
            provider="insecure-test",
        )
    )
    try:
        assert insecure.libvirt().getLibVersion() > 0
    finally:
        insecure.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("host key NOT verified" in w and "impersonate" in w for w in warnings)


def test_key_and_auth_errors_name_what_to_check(testbed: Testbed, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KeyFileError) as info:
        HostConnection(access_for(testbed, key_file=str(missing))).libvirt()
    assert f"SSH key file not found: {missing}" in str(info.value)
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(AuthenticationRefused) as refused:
        HostConnection(access_for(testbed, key_file=str(stranger))).libvirt()
    assert f"user {testbed.user!r}" in str(refused.value)
    assert "authorized_keys" in str(refused.value)


def test_socket_errors_are_diagnosed(testbed: Testbed) -> None:
    with pytest.raises(LibvirtSocketError) as missing:
        HostConnection(access_for(testbed, socket="/run/nowhere/libvirt-sock")).libvirt()
    assert "does not exist" in str(missing.value) and "is libvirtd running" in str(missing.value)
    # The admin socket is root-only: the testbed user cannot use it.
    with pytest.raises(LibvirtSocketError) as denied:
        HostConnection(access_for(testbed, socket="/var/run/libvirt/libvirt-admin-sock")).libvirt()
    assert "permission denied" in str(denied.value)
    assert f"usermod -aG libvirt {testbed.user}" in str(denied.value)


@pytest.mark.parametrize("level", ["info", "debug", "2"])
def test_trace_levels_from_the_environment_never_show_user_data(
    testbed: Testbed, level: str
) -> None:
    marker = f"MARK{uuid.uuid4().hex}"
    env = {**os.environ, "EGRESS_PROXIES_LOG": level}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.traced_session", marker],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    log = done.stderr
    assert marker not in log.replace(f"trace-{marker}.raw", "")  # only the volume's name holds it
    rpc_lines = [line for line in log.splitlines() if " kvm.libvirt " in line]
    if level == "info":
        assert rpc_lines == []
        return
    assert any(
        "virStoragePoolLookupByName provider=testbed host=testbed name=" in line
        for line in rpc_lines
    )
    assert any("virStorageVolCreateXML" in line and " ms)" in line for line in rpc_lines)
    assert any(
        "DEBUG kvm provider=testbed host=testbed connected" in line for line in log.splitlines()
    )
    has_xml = "<volume>" in log
    assert has_xml == (level == "2")
    assert ("names=" in log) == (level == "2")


def test_one_connection_shared_by_threads(testbed: Testbed) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from providers.kvm.connection import connect

    access = access_for(testbed, provider="shared-test")
    assert connect(access) is connect(access)  # one per host per process
    shared = connect(access)
    try:

        def work(_: int) -> int:
            pool = shared.libvirt().storagePoolLookupByName(testbed.pool)
            return len(pool.listAllVolumes(0)) + 1

        with ThreadPoolExecutor(8) as threads:
            assert all(n >= 1 for n in threads.map(work, range(64)))
        assert shared.opened == 1
    finally:
        shared.close()


EXIT_SCRIPT = """
from tests.support.testbed import load_testbed
from tests.support.testbed import access_for
from providers.kvm.connection import connect
testbed = load_testbed()
conn = connect(access_for(testbed)).libvirt()
kept = [conn.storagePoolLookupByName(testbed.pool), conn.listAllDomains(0)]
print("holding", len(kept))
"""


def test_interpreter_exit_does_not_hang_with_libvirt_objects_alive(testbed: Testbed) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "holding 2"


def test_dropped_connection_is_logged_with_its_reason(
    testbed: Testbed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kvm")
    sshd = PrivateSshd(testbed.sshd_config, testbed.known_hosts, tmp_path).start()
    conn = HostConnection(
        access_for(testbed, port=sshd.port, known_hosts_file=str(sshd.known_hosts))
    )
    try:
        conn.libvirt().getLibVersion()
        sshd.kill_sessions()
        wait_until(lambda: not conn.alive, "the drop to be noticed")
        conn.libvirt().getLibVersion()
    finally:
        conn.close()
        sshd.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "kvm"]
    assert any("connected user=" in m for m in messages)
    dropped = [m for m in messages if "connection dropped" in m]
    assert len(dropped) == 1 and "provider=testbed host=testbed" in dropped[0]
    assert "ssh session closed" in dropped[0] or "libvirt connection closed" in dropped[0]


UNPOOLED_EXIT_SCRIPT = """
from tests.support.testbed import load_testbed
from tests.support.testbed import access_for
from providers.kvm.connection import HostConnection
testbed = load_testbed()
conn = HostConnection(access_for(testbed)).libvirt()
kept = conn.storagePoolLookupByName(testbed.pool)
print("holding")
"""


def test_exit_does_not_hang_with_an_unpooled_connection_left_open(testbed: Testbed) -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNPOOLED_EXIT_SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "holding"
