"""DomainSpec: everything the builder needs, validated once, on construction."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from providers.kvm.domainxml._checks import (
    check_absolute_path,
    check_int,
    check_pattern,
    check_text,
    fail,
)
from providers.kvm.domainxml.metadata import ProxyMetadata

DomainType = Literal["kvm", "qemu"]
Firmware = Literal["uefi", "bios"]

DOMAIN_TYPES: tuple[DomainType, ...] = ("kvm", "qemu")
FIRMWARES: tuple[Firmware, ...] = ("uefi", "bios")

CPU_MODES = ("host-passthrough", "host-model", "maximum")
"""``cpu_mode`` values rendered as ``<cpu mode='VALUE'/>``; any other value names a
CPU model and renders as ``<cpu mode='custom'><model>VALUE</model></cpu>``."""

MIN_MEMORY_MIB = 128

NAME_RE = re.compile(r"proxy-[0-9a-f]{10}")
"""Domain names are proxy ids (proxyinfra.names.proxy_id)."""

_CPU_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_MAC_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no '/', ':' or whitespace.
_BRIDGE_RE = re.compile(r"[^\s/:]{1,15}")


@dataclass(frozen=True, kw_only=True)
class DomainSpec:
    """A proxy VM as the ProxyDomain resource wants it on one libvirt host.

    ``disk_path`` and ``seed_path`` are the resolved file paths of the overlay
    and seed volumes (``vol.path()``), not pool/volume references: AppArmor's
    virt-aa-helper labels file paths only. Exactly one of ``network`` (a
    libvirt network name) and ``bridge`` (a host bridge) is set.
    """

    name: str
    memory_mib: int
    vcpus: int
    disk_path: str
    seed_path: str
    metadata: ProxyMetadata
    domain_type: DomainType = "kvm"
    cpu_mode: str = "host-passthrough"
    firmware: Firmware = "uefi"
    secure_boot: bool = False
    network: str | None = None
    bridge: str | None = None
    mac: str | None = None
    serial_log: str | None = None

    def __post_init__(self) -> None:
        check_pattern("DomainSpec.name", self.name, NAME_RE, "a proxy id (proxy-<10 hex>)")
        if self.domain_type not in DOMAIN_TYPES:
            raise fail("DomainSpec.domain_type", self.domain_type, "is not 'kvm' or 'qemu'")
        check_int("DomainSpec.memory_mib", self.memory_mib, MIN_MEMORY_MIB)
        check_int("DomainSpec.vcpus", self.vcpus, 1)
        self._check_cpu_mode()
        if self.firmware not in FIRMWARES:
            raise fail("DomainSpec.firmware", self.firmware, "is not 'uefi' or 'bios'")
        if not isinstance(self.secure_boot, bool):
            raise fail("DomainSpec.secure_boot", self.secure_boot, "is not a bool")
        if self.secure_boot and self.firmware != "uefi":
            raise fail(
                "DomainSpec.secure_boot", True, "needs firmware 'uefi' (the image says 'bios')"
            )
        check_absolute_path("DomainSpec.disk_path", self.disk_path)
        check_absolute_path("DomainSpec.seed_path", self.seed_path)
        if self.disk_path == self.seed_path:
            raise fail("DomainSpec.seed_path", self.seed_path, "is the same file as disk_path")
        self._check_nic()
        if self.serial_log is not None:
            check_absolute_path("DomainSpec.serial_log", self.serial_log)
        if not isinstance(self.metadata, ProxyMetadata):
            raise fail("DomainSpec.metadata", self.metadata, "is not a ProxyMetadata")

    def _check_cpu_mode(self) -> None:
        field = "DomainSpec.cpu_mode"
        if self.cpu_mode == "custom":
            raise fail(field, self.cpu_mode, "is not a CPU model; name the model itself")
        if self.cpu_mode not in CPU_MODES:
            check_pattern(
                field,
                self.cpu_mode,
                _CPU_MODEL_RE,
                f"one of {', '.join(CPU_MODES)} or a CPU model name (e.g. Skylake-Client-v4)",
            )

    def _check_nic(self) -> None:
        if (self.network is None) == (self.bridge is None):
            raise ValueError(
                "DomainSpec.network/bridge: exactly one must be set, got "
                f"network={self.network!r} bridge={self.bridge!r}"
            )
        if self.bridge is not None:
            check_pattern(
                "DomainSpec.bridge",
                self.bridge,
                _BRIDGE_RE,
                "a Linux interface name (1-15 characters, no '/', ':' or spaces)",
            )
            if self.bridge in (".", ".."):
                raise fail("DomainSpec.bridge", self.bridge, "is not a Linux interface name")
        if self.network is not None:
            check_text("DomainSpec.network", self.network)
            if "/" in self.network:
                raise fail("DomainSpec.network", self.network, "contains '/'")
        if self.mac is not None:
            mac = check_text("DomainSpec.mac", self.mac).lower()
            if not _MAC_RE.fullmatch(mac):
                raise fail("DomainSpec.mac", self.mac, "is not a MAC address (52:54:00:xx:xx:xx)")
            if int(mac[:2], 16) & 1:
                raise fail("DomainSpec.mac", self.mac, "is a multicast address")
            if mac == "00:00:00:00:00:00":
                raise fail("DomainSpec.mac", self.mac, "is the all-zero address")
            object.__setattr__(self, "mac", mac)

    @property
    def cpu_model(self) -> str | None:
        """The custom CPU model name, or None when ``cpu_mode`` is a mode."""
        return None if self.cpu_mode in CPU_MODES else self.cpu_mode
