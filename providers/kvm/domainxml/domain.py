"""build_domain_xml: DomainSpec -> libvirt domain XML, deterministic text."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from providers.kvm.domainxml._xml import element, sub, to_pretty_string
from providers.kvm.domainxml.cpu import Cpu
from providers.kvm.domainxml.devices import (
    CdromDisk,
    Device,
    GuestAgentChannel,
    NoVideo,
    PtySerial,
    SerialConsole,
    VirtioDisk,
    VirtioInterface,
    VirtioMemballoon,
    VirtioRng,
)
from providers.kvm.domainxml.features import Features
from providers.kvm.domainxml.guestos import GuestOs
from providers.kvm.domainxml.spec import DomainSpec

LIFECYCLE = (("on_poweroff", "destroy"), ("on_reboot", "restart"), ("on_crash", "destroy"))


def devices_for(spec: DomainSpec) -> list[Device]:
    """The devices in the order they are written."""
    if spec.bridge is not None:
        nic = VirtioInterface("bridge", spec.bridge, spec.mac)
    else:
        assert spec.network is not None  # DomainSpec guarantees exactly one
        nic = VirtioInterface("network", spec.network, spec.mac)
    return [
        VirtioDisk(spec.disk_path),
        CdromDisk(spec.seed_path),
        nic,
        PtySerial(),
        SerialConsole(),
        GuestAgentChannel(),
        VirtioRng(),
        NoVideo(),
        VirtioMemballoon(),
    ]


def domain_element(spec: DomainSpec) -> ET.Element:
    domain = element("domain", {"type": spec.domain_type})
    sub(domain, "name", text=spec.name)
    sub(domain, "metadata").append(spec.metadata.to_element())
    sub(domain, "memory", {"unit": "MiB"}, text=str(spec.memory_mib))
    sub(domain, "vcpu", text=str(spec.vcpus))
    domain.append(GuestOs(spec.firmware).to_element())
    domain.append(Features().to_element())
    domain.append(Cpu(spec.cpu_mode).to_element())
    sub(domain, "clock", {"offset": "utc"})
    for tag, action in LIFECYCLE:
        sub(domain, tag, text=action)
    devices = sub(domain, "devices")
    for device in devices_for(spec):
        devices.append(device.to_element())
    return domain


def build_domain_xml(spec: DomainSpec) -> str:
    """The domain XML for ``virConnect.defineXML``: same spec, same text, byte for byte."""
    return to_pretty_string(domain_element(spec))
