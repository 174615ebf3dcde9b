"""DomainSpec: everything the builder needs, validated once, on construction."""

from __future__ import annotations

import re
from dataclasses import dataclass

from providers.kvm.domainxml._checks import (
    check_absolute_path,
    check_int,
    check_pattern,
    check_text,
    fail,
)
from providers.kvm.domainxml.metadata import ProxyMetadata
from providers.kvm.rules import (
    CPU_MODES,
    DEFAULT_CPU_MODE,
    DEFAULT_DOMAIN_TYPE,
    DEFAULT_FIRMWARE,
    MIN_MEMORY_MIB,
    DomainType,
    Firmware,
    bridge_problem,
    cpu_mode_problem,
    network_problem,
)

DOMAIN_TYPES: tuple[DomainType, ...] = ("kvm", "qemu")
FIRMWARES: tuple[Firmware, ...] = ("uefi", "bios")

NAME_RE = re.compile(r"proxy-[0-9a-f]{10}")
"""Domain names are proxy ids (proxyinfra.names.proxy_id)."""

_MAC_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


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
    domain_type: DomainType = DEFAULT_DOMAIN_TYPE
    cpu_mode: str = DEFAULT_CPU_MODE
    firmware: Firmware = DEFAULT_FIRMWARE
    network: str | None = None
    bridge: str | None = None
    mac: str | None = None

    def __post_init__(self) -> None:
        check_pattern("DomainSpec.name", self.name, NAME_RE, "a proxy id (proxy-<10 hex>)")
        if self.domain_type not in DOMAIN_TYPES:
            raise fail("DomainSpec.domain_type", self.domain_type, "is not 'kvm' or 'qemu'")
        check_int("DomainSpec.memory_mib", self.memory_mib, MIN_MEMORY_MIB)
        check_int("DomainSpec.vcpus", self.vcpus, 1)
        self._check_cpu_mode()
        if self.firmware not in FIRMWARES:
            raise fail("DomainSpec.firmware", self.firmware, "is not 'uefi' or 'bios'")
        check_absolute_path("DomainSpec.disk_path", self.disk_path)
        check_absolute_path("DomainSpec.seed_path", self.seed_path)
        if self.disk_path == self.seed_path:
            raise fail("DomainSpec.seed_path", self.seed_path, "is the same file as disk_path")
        self._check_nic()
        if not isinstance(self.metadata, ProxyMetadata):
            raise fail("DomainSpec.metadata", self.metadata, "is not a ProxyMetadata")

    def _check_cpu_mode(self) -> None:
        if problem := cpu_mode_problem(self.cpu_mode):
            raise fail("DomainSpec.cpu_mode", self.cpu_mode, problem)

    def _check_nic(self) -> None:
        if (self.network is None) == (self.bridge is None):
            raise ValueError(
                "DomainSpec.network/bridge: exactly one must be set, got "
                f"network={self.network!r} bridge={self.bridge!r}"
            )
        if self.bridge is not None and (problem := bridge_problem(self.bridge)):
            raise fail("DomainSpec.bridge", self.bridge, problem)
        if self.network is not None and (problem := network_problem(self.network)):
            raise fail("DomainSpec.network", self.network, problem)
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
