"""allowedClients as squid, firewalls and network policies need them."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


@dataclass(frozen=True)
class ClientRanges:
    """allowedClients as the network layer needs them: per address family, collapsed,
    IPv4-mapped IPv6 ranges (``::ffff:10.0.0.0/104``) written as the IPv4 they are."""

    v4: list[str]
    v6: list[str]

    @property
    def all(self) -> list[str]:
        return [*self.v4, *self.v6]

    @property
    def everyone(self) -> list[str]:
        """The families whose every address is admitted ("IPv4", "IPv6")."""
        found = ["IPv4"] if self.v4 == ["0.0.0.0/0"] else []
        return found + (["IPv6"] if self.v6 == ["::/0"] else [])


def client_ranges(cidrs: Sequence[str]) -> ClientRanges:
    """Collapse CIDRs the way squid sees them: IPv4 as IPv4-mapped IPv6, so
    ``::/1`` holds every IPv4 address and ranges may cover each other across
    families."""
    mapped: list[ipaddress.IPv6Network] = []
    for cidr in cidrs:
        net = ipaddress.ip_network(cidr)
        if isinstance(net, ipaddress.IPv4Network):
            net = ipaddress.IPv6Network(f"::ffff:{net.network_address}/{96 + net.prefixlen}")
        mapped.append(net)
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for net in ipaddress.collapse_addresses(mapped):
        if net.subnet_of(_V4_MAPPED):
            v4.append(_unmapped(net))
            continue
        v6.append(net)
        if _V4_MAPPED.subnet_of(net):  # e.g. ::/1 also admits every IPv4 client
            v4.append(ipaddress.IPv4Network("0.0.0.0/0"))
    v4 = list(ipaddress.collapse_addresses(v4))
    return ClientRanges([str(n) for n in v4], [str(n) for n in v6])


def _unmapped(net: ipaddress.IPv6Network) -> ipaddress.IPv4Network:
    address = ipaddress.IPv4Address(int(net.network_address) & 0xFFFFFFFF)
    return ipaddress.IPv4Network(f"{address}/{net.prefixlen - 96}")
