"""``<cpu>``: a mode (host-passthrough, host-model, maximum) or a named model."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub
from providers.kvm.rules import CPU_MODES


@dataclass(frozen=True)
class Cpu:
    """``mode_or_model``: a value of CPU_MODES, else the name of a CPU model."""

    mode_or_model: str

    def to_element(self) -> ET.Element:
        if self.mode_or_model in CPU_MODES:
            return element("cpu", {"mode": self.mode_or_model})
        cpu = element("cpu", {"mode": "custom"})
        sub(cpu, "model", text=self.mode_or_model)
        return cpu
