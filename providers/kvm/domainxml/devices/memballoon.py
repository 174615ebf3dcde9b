"""virtio memballoon: lets the host read guest memory statistics."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element


@dataclass(frozen=True)
class VirtioMemballoon:
    def to_element(self) -> ET.Element:
        return element("memballoon", {"model": "virtio"})
