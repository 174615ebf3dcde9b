"""Host checks over libvirt's in-memory test driver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import libvirt
import pytest

from providers.kvm.access import HostAccess
from providers.kvm.hostcheck import (
    KvmDevice,
    _domain_type,
    _kvm_device,
    _nic,
    _pool,
    kvm_device_row,
)
from providers.kvm.trace import wrap

libvirt.registerErrorHandler(lambda _c, _e: None, None)


@pytest.fixture
def conn() -> Iterator[Any]:
    raw = libvirt.open("test:///default")
    yield wrap(raw, "provider=p host=h")
    raw.close()


def access(**changes: Any) -> HostAccess:
    values: dict[str, Any] = {
        "provider": "p",
        "host": "h",
        "address": "192.0.2.1",
        "port": 22,
        "user": "virt",
        "key_file": "/k",
        "known_hosts_file": "/kh",
        "insecure_ignore_host_key": False,
        "socket": "/var/run/libvirt/libvirt-sock",
        "pool": "default-pool",
        "bridge": None,
        "network": "default",
    }
    values.update(changes)
    return HostAccess(**values)


def test_pool_present_reports_free_space(conn: Any) -> None:
    row = _pool("h", access(), conn)
    assert row.ok and row.detail.startswith("default-pool: ") and "GiB free of" in row.detail


def test_missing_pool_names_it_and_the_fix(conn: Any) -> None:
    row = _pool("h", access(pool="nope"), conn)
    assert not row.ok
    assert "pool 'nope' not found" in row.detail and "hosts[].pool" in row.detail


def test_network_present_and_missing(conn: Any) -> None:
    assert _nic("h", access(), conn, None).ok  # type: ignore[arg-type]
    row = _nic("h", access(network="gone"), conn, None)  # type: ignore[arg-type]
    assert not row.ok and "libvirt network 'gone' not found" in row.detail


class Caps:
    """A host whose libvirt offers only TCG for x86_64 (and kvm for another arch)."""

    def getCapabilities(self) -> str:
        return """<capabilities><guest><os_type>hvm</os_type>
          <arch name='x86_64'><domain type='qemu'/></arch></guest>
          <guest><os_type>hvm</os_type><arch name='aarch64'><domain type='kvm'/></arch></guest>
        </capabilities>"""


def test_domain_type_offered_or_not() -> None:
    assert _domain_type("h", "qemu", Caps()).ok
    row = _domain_type("h", "kvm", Caps())
    assert not row.ok
    assert (
        row.detail
        == "'kvm' not offered for x86_64 (offered: qemu); set hosts[].domainType: qemu (software emulation)"
    )


def device(mode: int, uid: int = 0, gid: int = 0) -> KvmDevice:
    # The qemu user of Debian: uid 64055, primary group 64055, member of kvm (107).
    return KvmDevice(mode, uid, gid, qemu_uid=64055, qemu_groups=frozenset({64055, 107}))


def test_kvm_device_the_qemu_user_cannot_open_fails_with_the_fix() -> None:
    row = kvm_device_row("h", True, device(0o600))
    assert not row.ok and row.check == "kvm device"
    assert row.detail.startswith(
        "/dev/kvm is 600 uid 0 gid 0: libvirt offers KVM but qemu (uid 64055)"
    )
    assert "chgrp kvm /dev/kvm && chmod 0660 /dev/kvm" in row.detail
    # Group kvm without group rights, or another group: still unusable.
    assert not kvm_device_row("h", True, device(0o640, gid=107)).ok
    assert not kvm_device_row("h", True, device(0o660, gid=5)).ok


def test_kvm_device_usable_by_group_owner_or_everyone_passes() -> None:
    assert kvm_device_row("h", True, device(0o660, gid=107)).ok  # Debian's udev rule
    assert kvm_device_row("h", True, device(0o600, uid=64055)).ok
    assert kvm_device_row("h", True, device(0o666)).ok
    # Nothing to be inconsistent about when libvirt offers no KVM.
    assert kvm_device_row("h", False, device(0o600)).ok


class KvmHost(Caps):
    """libvirt offering KVM, qemu running as +64055:+64055, and a shell that
    answers the check's one command with the device and qemu's groups."""

    def __init__(self, stat_line: str) -> None:
        self.stat_line = stat_line
        self.commands: list[str] = []

    def getCapabilities(self) -> str:
        return """<capabilities><host><secmodel><model>none</model></secmodel>
          <secmodel><model>dac</model><baselabel type='kvm'>+64055:+64055</baselabel></secmodel></host>
          <guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/><domain type='kvm'/></arch></guest>
        </capabilities>"""

    def ssh(self) -> KvmHost:
        return self

    def run(self, command: str) -> tuple[int, str, str]:
        self.commands.append(command)
        return 0, f"{self.stat_line}\n64055 107\n", ""


def test_kvm_device_reads_mode_and_qemu_groups_from_the_host() -> None:
    host = KvmHost("600 0 0")
    row = _kvm_device("h", host, host)  # type: ignore[arg-type]
    assert not row.ok and "600 uid 0 gid 0" in row.detail
    assert host.commands == [
        "stat -Lc '%a %u %g' /dev/kvm && id -G \"$(getent passwd 64055 | cut -d: -f1)\""
    ]
    host = KvmHost("660 0 107")
    assert _kvm_device("h", host, host).ok  # type: ignore[arg-type]
