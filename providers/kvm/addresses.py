"""Where a domain's address comes from, and the liveness check of its wait:
the guest agent (the guest's own view), a libvirt network's DHCP lease, or
the host's ARP table (bridges only). Each answers (address, source) or None."""

from __future__ import annotations

from typing import Any

import libvirt

from providers.kvm.errors import KvmError

AGENT = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT
ARP = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP


def _first_ipv4(interfaces: dict[str, Any], mac: str) -> str | None:
    for iface in interfaces.values():
        if (iface.get("hwaddr") or "").lower() != mac:
            continue
        for addr in iface.get("addrs") or []:
            if addr.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4:
                return str(addr["addr"])
    return None


class DomainStopped(KvmError):
    pass


# Where an address came from, as the create logs it.
FROM_AGENT = "the guest agent"
FROM_ARP = "the host's ARP table"


def _from(source: str, ip: str | None) -> tuple[str, str] | None:
    return (ip, source) if ip else None


def address_from_agent(dom: Any, mac: str) -> tuple[str, str] | None:
    """Also the liveness check of the wait (no extra RPC): asking the agent of a
    domain that is not running fails with OPERATION_INVALID."""
    try:
        return _from(FROM_AGENT, _first_ipv4(dom.interfaceAddresses(AGENT, 0), mac))
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID:
            raise DomainStopped(
                f"domain {dom.name()} stopped while booting: {error.get_error_message()}"
            ) from None
        return None  # no agent (yet): fall through to the other sources


def lease_ip(net: Any, mac: str) -> str | None:
    for lease in net.DHCPLeases(mac):
        if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and lease.get("ipaddr"):
            return str(lease["ipaddr"])
    return None


def address_from_lease(net: Any, mac: str, network: str) -> tuple[str, str] | None:
    return _from(f"the DHCP lease of network {network!r}", lease_ip(net, mac))


def address_from_arp(dom: Any, mac: str) -> tuple[str, str] | None:
    try:
        return _from(FROM_ARP, _first_ipv4(dom.interfaceAddresses(ARP, 0), mac))
    except libvirt.libvirtError:
        return None
