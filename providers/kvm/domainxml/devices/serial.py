"""The serial port (ttyS0), a pty."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class PtySerial:
    port: int = 0

    def to_element(self) -> ET.Element:
        serial = element("serial", {"type": "pty"})
        sub(serial, "target", {"port": str(self.port)})
        return serial
