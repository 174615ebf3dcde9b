"""One module per device; each device is a frozen dataclass with ``to_element()``.

Devices trust their fields: :class:`~providers.kvm.domainxml.spec.DomainSpec`
validates the inputs once, and :func:`~providers.kvm.domainxml.domain.build_domain_xml`
is the only place that turns a spec into devices.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Protocol

from providers.kvm.domainxml.devices.channel import GuestAgentChannel
from providers.kvm.domainxml.devices.console import SerialConsole
from providers.kvm.domainxml.devices.disk import CdromDisk, VirtioDisk
from providers.kvm.domainxml.devices.interface import VirtioInterface
from providers.kvm.domainxml.devices.memballoon import VirtioMemballoon
from providers.kvm.domainxml.devices.rng import VirtioRng
from providers.kvm.domainxml.devices.serial import PtySerial
from providers.kvm.domainxml.devices.video import NoVideo


class Device(Protocol):
    def to_element(self) -> ET.Element: ...


__all__ = [
    "CdromDisk",
    "Device",
    "GuestAgentChannel",
    "NoVideo",
    "PtySerial",
    "SerialConsole",
    "VirtioDisk",
    "VirtioInterface",
    "VirtioMemballoon",
    "VirtioRng",
]
