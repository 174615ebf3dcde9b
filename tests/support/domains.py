"""Domains for the tests that boot a guest on the testbed by hand (the
testbed's own smoke test, the test image's boot): the product's domain XML
(providers/kvm/domainxml) for a proxy on the testbed, with only what such a
test needs changed on the element tree, so a device the provider changes is
changed for these tests too.
"""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

from providers.kvm.domainxml import DomainSpec, ProxyMetadata
from providers.kvm.domainxml.domain import domain_element
from proxyinfra.names import overlay_volume, seed_volume
from tests.support.testbed import Testbed

STACK = "testbed-by-hand"  # the metadata's stack: no stack of a test's `up` or `gc`


def new_name() -> str:
    """A fresh domain name of the form DomainSpec takes (a proxy id)."""
    return f"proxy-{secrets.token_hex(5)}"


def disk_names(name: str) -> tuple[str, str]:
    """The overlay's and the seed's volume names for domain NAME, as the provider names them."""
    return overlay_volume(name), seed_volume(name)


def domain_on_the_testbed(testbed: Testbed, name: str, memory_mib: int = 256) -> ET.Element:
    """The provider's domain for NAME on the testbed (TCG, UEFI, its network),
    the disks the volumes `disk_names(NAME)` in the testbed's pool."""
    disk, seed = disk_names(name)
    spec = DomainSpec(
        name=name,
        memory_mib=memory_mib,
        vcpus=1,
        domain_type="qemu",
        cpu_mode="maximum",
        disk_path=str(testbed.pool_path / disk),
        seed_path=str(testbed.pool_path / seed),
        network=testbed.network,
        metadata=ProxyMetadata(
            project="egress-proxies", stack=STACK, name=name, created=datetime.now(UTC)
        ),
    )
    return domain_element(spec)


def console_to_file(domain: ET.Element, log: Path) -> ET.Element:
    """The serial port and console written to LOG (opened by libvirtd, so
    qemu needs no access to its directory) instead of a pty."""
    for tag in ("serial", "console"):
        device = _one(domain, f"devices/{tag}")
        device.set("type", "file")
        device.insert(0, ET.Element("source", {"path": str(log)}))
    return domain


def seed_on_virtio_scsi(domain: ET.Element) -> ET.Element:
    """The seed cdrom on a virtio-scsi controller instead of SATA (a kernel
    without an AHCI driver, such as Debian's cloud kernel, sees it there)."""
    cdrom = _one(domain, "devices/disk[@device='cdrom']")
    _one(cdrom, "target").set("bus", "scsi")
    ET.SubElement(cdrom, "address", {"type": "drive", "controller": "0"})
    controller = {"type": "scsi", "index": "0", "model": "virtio-scsi"}
    ET.SubElement(_one(domain, "devices"), "controller", controller)
    return domain


def network_boot_next(domain: ET.Element) -> ET.Element:
    """The NIC boots (PXE) when the disk has nothing to boot: with its
    option ROM, which a proxy's NIC goes without."""
    nic = _one(domain, "devices/interface")
    nic.remove(_one(nic, "rom"))
    ET.SubElement(nic, "boot", {"order": "2"})
    return domain


def to_xml(domain: ET.Element) -> str:
    return ET.tostring(domain, encoding="unicode")


def _one(parent: ET.Element, path: str) -> ET.Element:
    found = parent.find(path)
    assert found is not None, f"the provider's domain XML has no {path}"
    return found
