"""Disks: the overlay (virtio, boots first) and the cloud-init seed (SATA cdrom).

Both are ``type='file'`` with the resolved path rather than ``type='volume'``:
AppArmor's virt-aa-helper only labels file paths.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class VirtioDisk:
    path: str
    target: str = "vda"
    format: str = "qcow2"
    boot_order: int = 1

    def to_element(self) -> ET.Element:
        disk = element("disk", {"type": "file", "device": "disk"})
        sub(disk, "driver", {"name": "qemu", "type": self.format, "discard": "unmap"})
        sub(disk, "source", {"file": self.path})
        sub(disk, "target", {"dev": self.target, "bus": "virtio"})
        sub(disk, "boot", {"order": str(self.boot_order)})
        return disk


@dataclass(frozen=True)
class CdromDisk:
    """The NoCloud seed ISO. SATA, as the seed operator does: Debian's *cloud*
    kernel has no AHCI driver and will not see it; the generic kernel does."""

    path: str
    target: str = "sda"

    def to_element(self) -> ET.Element:
        disk = element("disk", {"type": "file", "device": "cdrom"})
        sub(disk, "driver", {"name": "qemu", "type": "raw"})
        sub(disk, "source", {"file": self.path})
        sub(disk, "target", {"dev": self.target, "bus": "sata"})
        sub(disk, "readonly")
        return disk
