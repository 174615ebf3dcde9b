"""The testbed itself, checked the way the provider will use it: as the
non-root user, over the testbed's sshd, with the host key checked."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.support.domains import (
    disk_names,
    domain_on_the_testbed,
    network_boot_next,
    new_name,
    to_xml,
)
from tests.support.stack_config import host, kvm_provider

if TYPE_CHECKING:
    from tests.support.testbed import Testbed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def names(output: str) -> list[str]:
    """First column of virsh -q list output."""
    return [line.split()[0] for line in output.splitlines() if line.strip()]


@pytest.mark.testbed_alone  # `up` again, or the machine's claim rewritten
def test_second_up_is_quick_and_changes_nothing(testbed: Testbed) -> None:
    pid_files = [testbed.state_dir / f"{d}.pid" for d in ("sshd", "libvirtd", "virtlogd")]
    pids = {p.name: p.read_text() for p in pid_files if p.exists()}
    assert "sshd.pid" in pids  # sshd is always the testbed's own
    written = [
        testbed.state_dir / n for n in ("env", "provider.yaml", "known_hosts", "sshd_config")
    ]
    mtimes = {p: p.stat().st_mtime_ns for p in written}

    started = time.monotonic()
    result = testbed.script("up")
    elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stderr
    assert elapsed < 10, f"a warm up took {elapsed:.1f}s"
    assert " started" not in result.stderr, result.stderr
    assert {p.name: p.read_text() for p in pid_files if p.exists()} == pids
    assert {p: p.stat().st_mtime_ns for p in written} == mtimes


@pytest.mark.testbed_alone  # `up` again, or the machine's claim rewritten
def test_a_second_checkout_neither_takes_over_nor_tears_down_the_testbed(
    testbed: Testbed, tmp_path: Path
) -> None:
    """The user, pool, network and port are the machine's: another checkout's
    `up` refuses (naming this one) before touching anything, and its `down`
    (what its test session runs after a failed `up`) leaves them alone."""
    other = tmp_path / "checkout"
    (other / "scripts").mkdir(parents=True)
    for name in ("testbed", "install-packages", "testbed-packages.txt"):
        shutil.copy2(ROOT / "scripts" / name, other / "scripts" / name)
    shutil.copytree(ROOT / "scripts" / "lib", other / "scripts" / "lib")
    script = other / "scripts" / "testbed"
    up = subprocess.run([str(script), "up"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 1
    assert f"the testbed of {ROOT} is up on this machine" in up.stderr, up.stderr
    assert not (other / ".testbed").exists()
    down = subprocess.run([str(script), "down"], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert f"the testbed on this machine is {ROOT}'s: nothing of it touched" in down.stderr
    status = testbed.script("status")
    assert status.returncode == 0, status.stdout


OWNER_FILE = Path("/run/egress-proxies-testbed.owner")


@pytest.mark.testbed_alone  # `up` again, or the machine's claim rewritten
def test_up_takes_over_a_testbed_a_killed_run_left_behind(testbed: Testbed, tmp_path: Path) -> None:
    """A CI job cut off mid-run leaves its checkout's claim on the machine with
    none of its daemons running: that testbed is not up, and `up` elsewhere
    takes its place (keeping what /dev/kvm was before any testbed) instead of
    refusing until someone runs the dead checkout's `down` by hand."""
    dead = tmp_path / "killed-checkout" / ".testbed"
    dead.mkdir(parents=True)
    exited = subprocess.Popen([sys.executable, "-c", ""])
    exited.wait()
    for daemon in ("sshd", "libvirtd", "virtlogd"):
        (dead / f"{daemon}.pid").write_text(f"{exited.pid}\n")
    (dead / "kvm-perms").write_text("600 root root\n")
    ours = OWNER_FILE.read_text()
    kvm_record = testbed.state_dir / "kvm-perms"
    had_record = kvm_record.exists()
    OWNER_FILE.write_text(f"{dead}\n")
    try:
        up = testbed.script("up")
        assert up.returncode == 0, up.stderr
        assert f"the testbed of {dead.parent} was left by a run that was killed" in up.stderr, (
            up.stderr
        )
        assert OWNER_FILE.read_text() == ours
        if not had_record:
            assert kvm_record.read_text() == "600 root root\n"
    finally:
        OWNER_FILE.write_text(ours)
        if not had_record:
            kvm_record.unlink(missing_ok=True)
    assert testbed.script("status").returncode == 0


def test_status_reports_everything_up(testbed: Testbed) -> None:
    result = testbed.script("status")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("ok") for line in lines), result.stdout
    for part in ("virtlogd", "libvirtd", "sshd", "kvm-device", "pool", "network", "ssh"):
        assert any(line.split()[1] == f"{part}:" for line in lines), part


def test_env_prints_the_env_file(testbed: Testbed) -> None:
    result = testbed.script("env")
    assert result.returncode == 0
    assert result.stdout == (testbed.state_dir / "env").read_text()
    assert f"export TESTBED_SSH_PORT='{testbed.ssh_port}'" in result.stdout.splitlines()


def test_provider_yaml_describes_the_testbed(testbed: Testbed) -> None:
    provider = yaml.safe_load(testbed.provider_yaml.read_text())
    the_host = host(
        "testbed",
        f"127.0.0.1:{testbed.ssh_port}",
        user=testbed.user,
        network=testbed.network,
        socket=testbed.socket,
        pool=testbed.pool,
        domain_type="qemu",
        cpu_mode="qemu64",
    )
    no_images: dict[str, Any] = {}  # each stack adds its own, and machine types
    assert provider == kvm_provider(
        testbed.key,
        testbed.known_hosts,
        name="testbed",
        hosts=[the_host],
        images=no_images,
        machine_types=no_images,
    )
    assert testbed.key.is_absolute() and testbed.key.exists()
    assert testbed.known_hosts.is_absolute()


def test_user_is_unprivileged_and_in_the_libvirt_group(testbed: Testbed) -> None:
    result = testbed.ssh("id", "-u", "-n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == testbed.user
    groups = testbed.ssh("id", "-Gn").stdout.split()
    assert "libvirt" in groups
    assert testbed.ssh("id", "-u").stdout.strip() != "0"


def test_user_sees_pool_and_network(testbed: Testbed) -> None:
    pools = testbed.virsh("pool-list")
    assert pools.returncode == 0, pools.stderr
    assert testbed.pool in names(pools.stdout)
    nets = testbed.virsh("net-list")
    assert nets.returncode == 0, nets.stderr
    assert testbed.network in names(nets.stdout)


def test_user_creates_and_deletes_a_volume(testbed: Testbed) -> None:
    vol = f"testbed-{secrets.token_hex(4)}.qcow2"
    try:
        made = testbed.virsh("vol-create-as", testbed.pool, vol, "1M", "--format", "qcow2")
        assert made.returncode == 0, made.stderr
        assert vol in names(testbed.virsh("vol-list", testbed.pool).stdout)
        path = Path(testbed.virsh("vol-path", "--pool", testbed.pool, vol).stdout.strip())
        assert path == testbed.pool_path / vol and path.exists()

        deleted = testbed.virsh("vol-delete", "--pool", testbed.pool, vol)
        assert deleted.returncode == 0, deleted.stderr
        assert vol not in names(testbed.virsh("vol-list", testbed.pool).stdout)
        assert not path.exists()
    finally:
        subprocess.run(
            ["virsh", "-q", "-c", "qemu:///system", "vol-delete", "--pool", testbed.pool, vol],
            capture_output=True,
            check=False,
        )


def test_login_with_a_wrong_host_key_is_refused(testbed: Testbed, tmp_path: Path) -> None:
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(f"[127.0.0.1]:{testbed.ssh_port} {key_type} {key_b64}\n")

    result = testbed.ssh("true", known_hosts=wrong)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr

    unknown = tmp_path / "known_hosts_empty"
    unknown.write_text("")
    result = testbed.ssh("true", known_hosts=unknown)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr

    assert testbed.ssh("true").returncode == 0  # the right one still gets in


def test_only_the_testbed_user_may_log_in(testbed: Testbed) -> None:
    result = testbed.ssh("true", user="root")
    assert result.returncode == 255
    assert "Permission denied" in result.stderr


def test_libvirt_socket_reachable_through_a_streamlocal_forward(testbed: Testbed) -> None:
    # How the provider reaches libvirt: a direct-streamlocal channel to
    # provider.yaml's socket path, here made by ssh -L onto a local socket.
    with tempfile.TemporaryDirectory(prefix="testbed-") as tmp:
        local = Path(tmp) / "libvirt.sock"
        forward = subprocess.Popen(
            testbed.ssh_argv(
                options=("-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:{testbed.socket}")
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 15
            while not local.exists():
                assert forward.poll() is None, forward.communicate()[1]
                assert time.monotonic() < deadline, "the forward never came up"
                time.sleep(0.05)
            result = subprocess.run(
                ["virsh", "-q", "-c", f"qemu+unix:///system?socket={local}", "pool-list"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            assert testbed.pool in names(result.stdout)
        finally:
            forward.terminate()
            forward.wait(timeout=10)


def test_network_is_isolated_and_hands_out_a_dhcp_range(testbed: Testbed) -> None:
    dumped = testbed.virsh("net-dumpxml", testbed.network)
    assert dumped.returncode == 0, dumped.stderr
    net = ET.fromstring(dumped.stdout)
    assert net.find("forward") is None  # isolated: no NAT, no routing off the host
    bridge, dns = net.find("bridge"), net.find("dns")
    assert bridge is not None and bridge.get("name") == testbed.bridge
    assert dns is not None and dns.get("enable") == "no"  # no forwarding of guests' queries
    ip = net.find("ip")
    assert ip is not None
    assert IPv4Address(ip.get("address")) == testbed.gateway
    assert IPv4Network(f"{testbed.gateway}/{ip.get('netmask')}", strict=False) == testbed.subnet
    dhcp_range = ip.find("dhcp/range")
    assert dhcp_range is not None
    start, end = IPv4Address(dhcp_range.get("start")), IPv4Address(dhcp_range.get("end"))
    assert start in testbed.subnet and end in testbed.subnet and start < end
    assert not start <= testbed.gateway <= end

    # Host side: the bridge holds the gateway address, and libvirt's dnsmasq runs for it.
    addrs = json.loads(
        subprocess.run(
            ["ip", "-j", "-4", "addr", "show", "dev", testbed.bridge],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert f"{testbed.gateway}/{testbed.subnet.prefixlen}" in {
        f"{a['local']}/{a['prefixlen']}" for a in addrs[0]["addr_info"]
    }
    dnsmasq_pid = Path(f"/run/libvirt/network/{testbed.network}.pid").read_text().strip()
    assert Path(f"/proc/{dnsmasq_pid}/comm").read_text().strip() == "dnsmasq"


def test_user_runs_a_qemu_domain_that_gets_a_dhcp_lease(testbed: Testbed) -> None:
    # What the provider will do, minus a real image: its domain (q35, TCG,
    # UEFI), an (empty) disk and seed from the pool that qemu must be able
    # to open, and a NIC on the testbed network. OVMF finds nothing on the
    # disk and falls back to PXE (the NIC boots next), whose DHCP request
    # shows the network hands out leases.
    name = new_name()
    disk, seed = disk_names(name)
    xml = to_xml(network_boot_next(domain_on_the_testbed(testbed, name)))
    try:
        for volume, size, fmt in ((disk, "16M", "qcow2"), (seed, "1M", "raw")):
            made = testbed.virsh("vol-create-as", testbed.pool, volume, size, "--format", fmt)
            assert made.returncode == 0, made.stderr
        defined = testbed.virsh("define", "/dev/stdin", stdin=xml)
        assert defined.returncode == 0, defined.stderr
        started = testbed.virsh("start", name)
        assert started.returncode == 0, started.stderr
        assert testbed.virsh("domstate", name).stdout.strip() == "running"

        deadline = time.monotonic() + 60
        lease = ""
        while not lease:
            assert time.monotonic() < deadline, "no DHCP lease within 60 s"
            time.sleep(1)
            lease = testbed.virsh("domifaddr", name, "--source", "lease").stdout.strip()
        address = IPv4Address(lease.split()[-1].split("/")[0])
        assert address in testbed.subnet

        destroyed = testbed.virsh("destroy", name)
        assert destroyed.returncode == 0, destroyed.stderr
        # A UEFI domain keeps an NVRAM file; undefine refuses without --nvram.
        undefined = testbed.virsh("undefine", name, "--nvram")
        assert undefined.returncode == 0, undefined.stderr
    finally:
        testbed.virsh("destroy", name)
        testbed.virsh("undefine", name, "--nvram")
        for volume in (disk, seed):
            testbed.virsh("vol-delete", "--pool", testbed.pool, volume)
