"""``<os>``: q35/x86_64 hvm, with UEFI picked by libvirt's firmware autoselection.

UEFI: ``<os firmware='efi'>`` plus explicit ``<firmware>`` features turning
secure boot off, because without them libvirt may pick a secure-boot OVMF
with enrolled keys. BIOS: no firmware attribute (SeaBIOS). No
``<boot dev=...>``: the disk carries ``<boot order='1'/>`` and libvirt
refuses both kinds of boot order at once.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub
from providers.kvm.rules import Firmware

ARCH = "x86_64"
MACHINE = "q35"

SECURE_BOOT_FEATURES = ("secure-boot", "enrolled-keys")


@dataclass(frozen=True)
class GuestOs:
    firmware: Firmware

    def to_element(self) -> ET.Element:
        attrs = {"firmware": "efi"} if self.firmware == "uefi" else {}
        os_node = element("os", attrs)
        sub(os_node, "type", {"arch": ARCH, "machine": MACHINE}, text="hvm")
        if self.firmware == "uefi":
            firmware = sub(os_node, "firmware")
            for feature in SECURE_BOOT_FEATURES:
                sub(firmware, "feature", {"enabled": "no", "name": feature})
        return os_node
