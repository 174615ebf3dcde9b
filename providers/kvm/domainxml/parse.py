"""parse_domain: read back what the ProxyDomain resource's Read needs.

Works on the XML libvirt returns (``dom.XMLDesc()``), not only on what
:func:`build_domain_xml` writes: libvirt converts memory to KiB, may expand
``firmware='efi'`` into ``<loader type='pflash'>``, adds attributes
(``placement``, ``index``, ``portid``, ...) and may rename the metadata prefix.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml import _xml
from providers.kvm.domainxml.metadata import ProxyMetadata, metadata_from_element
from providers.kvm.rules import Firmware

MIB = 1024 * 1024

# libvirt's scaled-integer units (virScaleInteger): powers of 1024 unless the
# unit says decimal (KB, MB, ...). No unit attribute means KiB.
_UNIT_BYTES: dict[str, int] = {"b": 1, "bytes": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    _UNIT_BYTES[_letter] = 1024**_power
    _UNIT_BYTES[f"{_letter}ib"] = 1024**_power
    _UNIT_BYTES[f"{_letter}b"] = 1000**_power


@dataclass(frozen=True)
class DiskInfo:
    device: str
    """``disk``, ``cdrom``, ..."""
    target: str | None
    bus: str | None
    path: str | None
    """``<source file=...>`` (or ``dev=`` for block disks); None for other sources."""
    format: str | None


@dataclass(frozen=True)
class InterfaceInfo:
    type: str
    """``bridge``, ``network``, ..."""
    source: str | None
    """The bridge or network name (the source attribute named like ``type``)."""
    mac: str | None
    model: str | None


@dataclass(frozen=True)
class DomainInfo:
    name: str
    domain_type: str
    memory_mib: int
    vcpus: int
    firmware: Firmware
    secure_boot: bool
    cpu_mode: str | None
    """As in DomainSpec: a mode, or the model name of ``mode='custom'``; None without ``<cpu>``."""
    disks: tuple[DiskInfo, ...]
    interfaces: tuple[InterfaceInfo, ...]
    metadata: ProxyMetadata | None

    def _first_disk(self, device: str) -> DiskInfo | None:
        return next((d for d in self.disks if d.device == device), None)

    @property
    def disk_path(self) -> str | None:
        """Path of the first ``device='disk'`` disk (the overlay)."""
        disk = self._first_disk("disk")
        return disk.path if disk else None

    @property
    def seed_path(self) -> str | None:
        """Path of the first cdrom (the seed ISO)."""
        disk = self._first_disk("cdrom")
        return disk.path if disk else None

    @property
    def mac(self) -> str | None:
        return self.interfaces[0].mac if self.interfaces else None

    @property
    def bridge(self) -> str | None:
        nic = self.interfaces[0] if self.interfaces else None
        return nic.source if nic and nic.type == "bridge" else None

    @property
    def network(self) -> str | None:
        nic = self.interfaces[0] if self.interfaces else None
        return nic.source if nic and nic.type == "network" else None


def _required(root: ET.Element, path: str) -> ET.Element:
    found = root.find(path)
    if found is None:
        raise ValueError(f"domain XML: element <{path}> is missing")
    return found


def _int_text(node: ET.Element, what: str) -> int:
    text = (node.text or "").strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"domain XML: {what} {text!r} is not an integer") from None


def _memory_mib(node: ET.Element) -> int:
    amount = _int_text(node, "memory")
    unit = node.get("unit", "KiB")
    factor = _UNIT_BYTES.get(unit.lower())
    if factor is None:
        raise ValueError(f"domain XML: memory unit {unit!r} is unknown")
    return amount * factor // MIB


def _firmware(os_node: ET.Element | None) -> tuple[Firmware, bool]:
    if os_node is None:
        return "bios", False
    loader = os_node.find("loader")
    uefi = os_node.get("firmware") == "efi" or (
        loader is not None and loader.get("type") == "pflash"
    )
    if not uefi:
        return "bios", False
    secure = loader is not None and loader.get("secure") == "yes"
    for feature in os_node.findall("firmware/feature"):
        if feature.get("name") == "secure-boot":
            secure = feature.get("enabled") == "yes"
    return "uefi", secure


def _cpu_mode(cpu: ET.Element | None) -> str | None:
    if cpu is None:
        return None
    mode = cpu.get("mode", "custom")
    if mode != "custom":
        return mode
    model = cpu.find("model")
    if model is None:
        return None
    return (model.text or "").strip() or None


def _disk(node: ET.Element) -> DiskInfo:
    source = node.find("source")
    target = node.find("target")
    driver = node.find("driver")
    path = None
    if source is not None:
        path = source.get("file") or source.get("dev")
    return DiskInfo(
        device=node.get("device", "disk"),
        target=target.get("dev") if target is not None else None,
        bus=target.get("bus") if target is not None else None,
        path=path,
        format=driver.get("type") if driver is not None else None,
    )


def _interface(node: ET.Element) -> InterfaceInfo:
    kind = node.get("type", "")
    source = node.find("source")
    mac = node.find("mac")
    address = mac.get("address") if mac is not None else None
    model = node.find("model")
    return InterfaceInfo(
        type=kind,
        source=source.get(kind) if source is not None else None,
        mac=address.lower() if address else None,
        model=model.get("type") if model is not None else None,
    )


def parse_domain(xml: str) -> DomainInfo:
    """Read a domain XML (ours or libvirt's rendering of it).

    Raises ValueError when the text is not a ``<domain>`` or lacks name,
    memory or vcpu. The metadata is None for a domain without our element.
    """
    root = _xml.parse(xml, "domain XML")
    if root.tag != "domain":
        raise ValueError(f"domain XML: root element is <{root.tag}>, not <domain>")
    firmware, secure_boot = _firmware(root.find("os"))
    return DomainInfo(
        name=(_required(root, "name").text or "").strip(),
        domain_type=root.get("type", ""),
        memory_mib=_memory_mib(_required(root, "memory")),
        vcpus=_int_text(_required(root, "vcpu"), "vcpu"),
        firmware=firmware,
        secure_boot=secure_boot,
        cpu_mode=_cpu_mode(root.find("cpu")),
        disks=tuple(_disk(d) for d in root.findall("devices/disk")),
        interfaces=tuple(_interface(i) for i in root.findall("devices/interface")),
        metadata=metadata_from_element(root),
    )
