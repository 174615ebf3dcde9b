"""virtio-rng fed from the host's /dev/urandom: a fresh VM has entropy at once
(ssh host keys, TLS) instead of waiting on interrupts under TCG."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class VirtioRng:
    source: str = "/dev/urandom"

    def to_element(self) -> ET.Element:
        rng = element("rng", {"model": "virtio"})
        sub(rng, "backend", {"model": "random"}, text=self.source)
        return rng
