"""No display: ``<model type='none'/>`` stops libvirt adding a default VGA."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from providers.kvm.domainxml._xml import element, sub


@dataclass(frozen=True)
class NoVideo:
    def to_element(self) -> ET.Element:
        video = element("video")
        sub(video, "model", {"type": "none"})
        return video
