"""``<features>``: ACPI (UEFI on x86 requires it, and ``virsh shutdown`` sends an
ACPI power button), APIC, and SMM when secure boot is on (q35 + secure-boot
OVMF will not start without it)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class Features:
    smm: bool = False

    def to_element(self) -> ET.Element:
        features = element("features")
        sub(features, "acpi")
        sub(features, "apic")
        if self.smm:
            sub(features, "smm", {"state": "on"})
        return features
