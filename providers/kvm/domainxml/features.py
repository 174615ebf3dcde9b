"""``<features>``: ACPI (UEFI on x86 requires it, and ``virsh shutdown`` sends an
ACPI power button) and APIC. No SMM: secure boot is always off."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class Features:
    def to_element(self) -> ET.Element:
        features = element("features")
        sub(features, "acpi")
        sub(features, "apic")
        return features
