"""The console, bound to the serial port (``virsh console`` reaches ttyS0)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class SerialConsole:
    port: int = 0

    def to_element(self) -> ET.Element:
        console = element("console", {"type": "pty"})
        sub(console, "target", {"type": "serial", "port": str(self.port)})
        return console
