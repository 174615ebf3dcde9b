"""The proxy's single NIC: virtio on a host bridge or on a libvirt network.

Without an option ROM: a proxy boots from its disk only, and the firmware
would load and start the NIC's iPXE ROM at every boot for nothing (about 2 s
of a boot under TCG, measured; and code no proxy needs on its network)."""

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
        sub(nic, "rom", {"enabled": "no"})
        return nic
