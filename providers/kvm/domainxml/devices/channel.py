"""The qemu guest-agent channel (libvirt picks the host-side socket path)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub

GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"


@dataclass(frozen=True)
class GuestAgentChannel:
    name: str = GUEST_AGENT_CHANNEL

    def to_element(self) -> ET.Element:
        channel = element("channel", {"type": "unix"})
        sub(channel, "target", {"type": "virtio", "name": self.name})
        return channel
