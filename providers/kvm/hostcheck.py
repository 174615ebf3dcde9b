"""Check a libvirt host the way an operator would before wiring it in."""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
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

GIB = 1024**3


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
        lambda: _nic(h, access, conn, connection),
        lambda: _domain_type(h, domain_type, conn),
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
