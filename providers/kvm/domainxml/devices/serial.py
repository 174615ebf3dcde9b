"""The serial port (ttyS0), a pty, optionally copied to a log file.

The log is written by virtlogd, so it survives a console that nobody reads;
tests use it to watch a guest boot.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class PtySerial:
    log_file: str | None = None
    port: int = 0

    def to_element(self) -> ET.Element:
        serial = element("serial", {"type": "pty"})
        if self.log_file is not None:
            sub(serial, "log", {"file": self.log_file, "append": "on"})
        sub(serial, "target", {"port": str(self.port)})
        return serial
