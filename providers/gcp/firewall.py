"""The firewall rules of a gcp provider entry: the proxy port, from allowedClients only.

GCP firewall rules cannot mix IPv4 and IPv6 source ranges, so each family
present gets its own rule. Both target the stack's network tag, never every
VM of the network.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from providers.gcp.config import GcpProviderEntry
from proxyinfra.clients import client_ranges
from proxyinfra.config import Squid


def firewall_rules(
    provider: GcpProviderEntry,
    squid: Squid,
    tag: str,
    gcp_provider: gcp.Provider,
) -> list[gcp.compute.Firewall]:
    ranges = client_ranges(squid.allowed_clients)
    if ranges.everyone and not squid.allow_open_proxy_to_the_internet:
        # Validation refuses this already; a rule open to the internet must
        # never be registered by accident.
        raise ValueError("allowedClients admits everyone without allowOpenProxyToTheInternet")
    rules = []
    for family, sources in (("ipv4", ranges.v4), ("ipv6", ranges.v6)):
        if not sources:
            continue
        rules.append(
            gcp.compute.Firewall(
                f"{provider.name}-proxy-port-{family}",
                name=f"{tag}-{family}",
                description=(
                    f"egress-proxies: squid port of the proxies tagged {tag}, "
                    "from squid.allowedClients only"
                ),
                network=provider.gcp.network,
                direction="INGRESS",
                priority=1000,
                allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=[str(squid.port)])],
                source_ranges=sources,
                target_tags=[tag],
                # A fixed name: a replacement must free it first.
                opts=pulumi.ResourceOptions(provider=gcp_provider, delete_before_replace=True),
            )
        )
    return rules
