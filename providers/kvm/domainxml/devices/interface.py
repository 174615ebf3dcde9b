"""The proxy's single NIC: virtio on a host bridge or on a libvirt network."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Literal

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class VirtioInterface:
    kind: Literal["bridge", "network"]
    source: str
    mac: str | None = None

    def to_element(self) -> ET.Element:
        nic = element("interface", {"type": self.kind})
        if self.mac is not None:
            sub(nic, "mac", {"address": self.mac})
        sub(nic, "source", {self.kind: self.source})
        sub(nic, "model", {"type": "virtio"})
        return nic
