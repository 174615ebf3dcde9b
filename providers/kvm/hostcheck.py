"""Check a libvirt host the way an operator would before wiring it in."""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.capacity import GIB, MIB, free_memory
from providers.kvm.connection import HostConnection
from providers.kvm.errors import (
    AuthenticationRefused,
    HostError,
    HostKeyMismatch,
    HostKeyUnknown,
    KeyFileError,
    LibvirtSocketError,
    LibvirtUnavailable,
)


@dataclass(frozen=True)
class CheckRow:
    host: str
    check: str
    ok: bool
    detail: str


def _ssh_rows(access: HostAccess, error: HostError | None) -> list[CheckRow]:
    h = access.host
    if error is None:
        return [
            CheckRow(h, "ssh reachable", True, f"{access.user}@{access.address}:{access.port}"),
            CheckRow(
                h,
                "host key verified",
                True,
                "insecureIgnoreHostKey" if access.insecure_ignore_host_key else "known_hosts",
            ),
            CheckRow(h, "ssh key accepted", True, access.key_file),
        ]
    text = f"{error.problem}; {error.fix}"
    if isinstance(error, KeyFileError):
        return [CheckRow(h, "ssh key file", False, text)]
    if isinstance(error, HostKeyUnknown | HostKeyMismatch):
        return [
            CheckRow(h, "ssh reachable", True, f"{access.address}:{access.port}"),
            CheckRow(h, "host key verified", False, text),
        ]
    if isinstance(error, AuthenticationRefused):
        return [
            CheckRow(h, "ssh reachable", True, f"{access.address}:{access.port}"),
            CheckRow(h, "host key verified", True, "known_hosts"),
            CheckRow(h, "ssh key accepted", False, text),
        ]
    return [CheckRow(h, "ssh reachable", False, text)]


def check_host(access: HostAccess, domain_type: str, connection: HostConnection) -> list[CheckRow]:
    """Rows in check order; checks that depend on a failed one are left out."""
    h = access.host
    try:
        connection.ssh()
    except HostError as error:
        return _ssh_rows(access, error)
    rows = _ssh_rows(access, None)
    try:
        conn = connection.libvirt()
    except (LibvirtSocketError, LibvirtUnavailable) as error:
        return [*rows, CheckRow(h, "libvirt socket usable", False, f"{error.problem}; {error.fix}")]
    except HostError as error:
        return [*rows, CheckRow(h, "libvirt socket usable", False, str(error))]
    rows.append(CheckRow(h, "libvirt socket usable", True, access.socket))
    checks: list[Callable[[], CheckRow]] = [
        lambda: _pool(h, access, conn),
        lambda: _memory(h, conn),
        lambda: _nic(h, access, conn, connection),
        lambda: _domain_type(h, domain_type, conn),
        lambda: _kvm_device(h, conn, connection),
        lambda: _uefi(h, domain_type, conn),
    ]
    for check in checks:
        rows.append(check())
    return rows


def _pool(h: str, access: HostAccess, conn: Any) -> CheckRow:
    try:
        pool = conn.storagePoolLookupByName(access.pool)
        if not pool.isActive():
            return CheckRow(
                h,
                "storage pool",
                False,
                f"pool {access.pool!r} is not active; virsh pool-start {access.pool}",
            )
        pool.refresh(0)
        _, capacity, _, available = pool.info()
    except libvirt.libvirtError as error:
        return CheckRow(
            h,
            "storage pool",
            False,
            f"pool {access.pool!r} not found ({error.get_error_message()}); define it (virsh pool-define-as "
            f"{access.pool} dir --target /var/lib/libvirt/images) or fix hosts[].pool",
        )
    return CheckRow(
        h,
        "storage pool",
        True,
        f"{access.pool}: {available / GIB:.1f} GiB free of {capacity / GIB:.1f} GiB",
    )


def _memory(h: str, conn: Any) -> CheckRow:
    """What a domain create checks its memory against (capacity.free_memory)."""
    try:
        free = free_memory(conn)
        total = int(conn.getInfo()[1]) * MIB
    except libvirt.libvirtError as error:
        return CheckRow(
            h, "memory", False, f"cannot read the host's memory ({error.get_error_message()})"
        )
    return CheckRow(
        h,
        "memory",
        True,
        f"{free / GIB:.1f} GiB for guests (free and page cache) of {total / GIB:.1f} GiB",
    )


def _nic(h: str, access: HostAccess, conn: Any, connection: HostConnection) -> CheckRow:
    if access.network is not None:
        try:
            net = conn.networkLookupByName(access.network)
            if not net.isActive():
                return CheckRow(
                    h,
                    "network",
                    False,
                    f"network {access.network!r} is not active; virsh net-start {access.network}",
                )
        except libvirt.libvirtError:
            return CheckRow(
                h,
                "network",
                False,
                f"libvirt network {access.network!r} not found; define it or fix hosts[].network",
            )
        return CheckRow(h, "network", True, access.network)
    bridge = access.bridge or ""
    status, _, _ = connection.ssh().run(f"test -d /sys/class/net/{shlex.quote(bridge)}/bridge")
    if status != 0:
        return CheckRow(
            h,
            "bridge",
            False,
            f"bridge {bridge!r} not found on the host; create it or fix hosts[].bridge",
        )
    return CheckRow(h, "bridge", True, bridge)


def _domain_type(h: str, domain_type: str, conn: Any) -> CheckRow:
    caps = ET.fromstring(conn.getCapabilities())
    types: set[str] = set()
    for arch in caps.findall("guest/arch[@name='x86_64']"):
        types |= {d.get("type") or "" for d in arch.findall("domain")}
    if domain_type not in types:
        fix = (
            "set hosts[].domainType: qemu (software emulation)"
            if domain_type == "kvm"
            else "install qemu-system-x86"
        )
        return CheckRow(
            h,
            "domain type",
            False,
            f"{domain_type!r} not offered for x86_64 (offered: {', '.join(sorted(t for t in types if t))}); {fix}",
        )
    return CheckRow(h, "domain type", True, domain_type)


@dataclass(frozen=True)
class KvmDevice:
    """/dev/kvm on the host and who qemu runs as there."""

    mode: int
    uid: int
    gid: int
    qemu_uid: int
    qemu_groups: frozenset[int]  # primary and supplementary

    def qemu_can_open(self) -> bool:
        if self.mode & 0o006 == 0o006:
            return True
        if self.uid == self.qemu_uid and self.mode & 0o600 == 0o600:
            return True
        return self.gid in self.qemu_groups and self.mode & 0o060 == 0o060


def _qemu_identity(caps: ET.Element) -> tuple[int, int] | None:
    """uid and gid libvirt runs KVM guests as: its DAC label, e.g. `+64055:+107`."""
    for model in caps.findall("host/secmodel"):
        if model.findtext("model") != "dac":
            continue
        label = model.find("baselabel[@type='kvm']")
        if label is not None and label.text:
            user, _, group = label.text.partition(":")
            return int(user.lstrip("+")), int(group.lstrip("+"))
    return None


def kvm_device_row(h: str, kvm_offered: bool, device: KvmDevice | None) -> CheckRow:
    """Whether libvirt's view of KVM is consistent with /dev/kvm.

    libvirt 9.0 offers KVM when /dev/kvm exists; when the qemu user cannot
    open it, libvirtd takes its cached QEMU capabilities for stale on every
    lookup and probes QEMU again (seconds each; a define was seen blocking
    for minutes), whatever domain type the proxies use."""
    if not kvm_offered:
        return CheckRow(h, "kvm device", True, "KVM not offered (TCG only): nothing to check")
    if device is None:
        return CheckRow(h, "kvm device", True, "KVM offered; /dev/kvm or qemu's user not readable")
    perms = f"/dev/kvm is {device.mode:o} uid {device.uid} gid {device.gid}"
    if device.qemu_can_open():
        return CheckRow(h, "kvm device", True, f"{perms}, usable by qemu (uid {device.qemu_uid})")
    return CheckRow(
        h,
        "kvm device",
        False,
        f"{perms}: libvirt offers KVM but qemu (uid {device.qemu_uid}) cannot open it, so libvirtd "
        "re-probes QEMU on every capabilities lookup and stalls; on the host run "
        "`chgrp kvm /dev/kvm && chmod 0660 /dev/kvm` (what Debian's udev rule sets; without udev, "
        "repeat it at boot)",
    )


def _kvm_device(h: str, conn: Any, connection: HostConnection) -> CheckRow:
    caps = ET.fromstring(conn.getCapabilities())
    offered = any(d.get("type") == "kvm" for d in caps.findall("guest/arch[@name='x86_64']/domain"))
    identity = _qemu_identity(caps)
    if not offered or identity is None:
        return kvm_device_row(h, offered, None)
    uid, gid = identity
    # stat needs no access to the device; `id -G` lists the groups qemu gets.
    _, out, _ = connection.ssh().run(
        f"stat -Lc '%a %u %g' /dev/kvm && id -G \"$(getent passwd {uid} | cut -d: -f1)\""
    )
    lines = out.splitlines()
    if not lines:
        return kvm_device_row(h, offered, None)
    mode, owner, group = lines[0].split()
    groups = {gid, *(int(g) for g in (lines[1].split() if len(lines) > 1 else []))}
    device = KvmDevice(int(mode, 8), int(owner), int(group), uid, frozenset(groups))
    return kvm_device_row(h, offered, device)


def _uefi(h: str, domain_type: str, conn: Any) -> CheckRow:
    try:
        xml = conn.getDomainCapabilities(None, "x86_64", "q35", domain_type, 0)
    except libvirt.libvirtError as error:
        return CheckRow(
            h,
            "UEFI firmware",
            False,
            f"cannot read domain capabilities: {error.get_error_message()}",
        )
    root = ET.fromstring(xml)
    firmware = [v.text for v in root.findall("os/enum[@name='firmware']/value")]
    loaders = [v.text for v in root.findall("os/loader/value")]
    if "efi" not in firmware and not loaders:
        return CheckRow(
            h, "UEFI firmware", False, "no UEFI firmware offered; install ovmf on the host"
        )
    return CheckRow(h, "UEFI firmware", True, ", ".join(t for t in loaders if t) or "efi")
