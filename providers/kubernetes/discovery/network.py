"""How clients reach the discovery service and what it may reach: its
Service (of the configured type) and its NetworkPolicy.

Ingress: the configured clients (allowedClients' CIDRs, clientNamespaces'
pods) on the API and gateway ports, nothing else. Egress: the proxies'
ports (squid's and external proxies' own: their addresses are the manifest's
and change with it, so the policy names ports), the database (the stack's
own PostgreSQL pod by label, or an existing one's port) and DNS. The health
probes' and the gateway's traffic reaches sites through the proxies only.
"""

from __future__ import annotations

import pulumi_kubernetes as k8s

from providers.kubernetes.discovery.names import (
    API_PORT_NAME,
    GATEWAY_PORT_NAME,
    POSTGRES_PORT,
    selector,
)
from proxyinfra.backend import DiscoveryRequest
from proxyinfra.clients import client_ranges

core = k8s.core.v1
net = k8s.networking.v1
meta = k8s.meta.v1


def ports(request: DiscoveryRequest) -> list[tuple[str, int]]:
    """(name, port) of what the service listens on."""
    config = request.config
    listed = [(API_PORT_NAME, config.port)]
    if config.gateway is not None:
        listed.append((GATEWAY_PORT_NAME, config.gateway.port))
    return listed


def service_spec(request: DiscoveryRequest) -> core.ServiceSpecArgs:
    config = request.config
    kind = config.service.type
    service_ports = [
        core.ServicePortArgs(name=name, port=port, target_port=name, protocol="TCP")
        for name, port in ports(request)
    ]
    spec = core.ServiceSpecArgs(
        type=kind, selector=selector(request, "discovery"), ports=service_ports
    )
    if kind == "LoadBalancer":
        spec = core.ServiceSpecArgs(
            type=kind,
            selector=selector(request, "discovery"),
            ports=service_ports,
            # Local keeps the client's address for the NetworkPolicy and the
            # service's per-address brake.
            external_traffic_policy="Local",
            load_balancer_source_ranges=client_ranges(config.allowed_clients).all,
        )
    return spec


def network_policy_spec(request: DiscoveryRequest) -> net.NetworkPolicySpecArgs:
    config = request.config
    peers = [
        net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=cidr))
        for cidr in client_ranges(config.allowed_clients).all
    ]
    peers += [
        net.NetworkPolicyPeerArgs(
            namespace_selector=meta.LabelSelectorArgs(
                match_labels={"kubernetes.io/metadata.name": namespace}
            )
        )
        for namespace in config.client_namespaces
    ]
    if not peers:  # validation refuses it; an ingress rule without peers admits everyone
        raise ValueError("no allowedClients or clientNamespaces: the policy would admit everyone")
    tcp = [net.NetworkPolicyPortArgs(protocol="TCP", port=port) for port in request.proxy_ports]
    egress = [net.NetworkPolicyEgressRuleArgs(ports=tcp)]
    if config.database.postgres is not None:
        egress.append(
            net.NetworkPolicyEgressRuleArgs(
                to=[
                    net.NetworkPolicyPeerArgs(
                        pod_selector=meta.LabelSelectorArgs(
                            match_labels=selector(request, "database")
                        )
                    )
                ],
                ports=[net.NetworkPolicyPortArgs(protocol="TCP", port=POSTGRES_PORT)],
            )
        )
    else:
        egress.append(
            net.NetworkPolicyEgressRuleArgs(
                ports=[net.NetworkPolicyPortArgs(protocol="TCP", port=config.database.port)]
            )
        )
    egress.append(
        net.NetworkPolicyEgressRuleArgs(
            ports=[
                net.NetworkPolicyPortArgs(protocol="UDP", port=53),
                net.NetworkPolicyPortArgs(protocol="TCP", port=53),
            ]
        )
    )
    return net.NetworkPolicySpecArgs(
        pod_selector=meta.LabelSelectorArgs(match_labels=selector(request, "discovery")),
        policy_types=["Ingress", "Egress"],
        ingress=[
            net.NetworkPolicyIngressRuleArgs(
                from_=peers,
                ports=[
                    net.NetworkPolicyPortArgs(protocol="TCP", port=port)
                    for _, port in ports(request)
                ],
            )
        ],
        egress=egress,
    )


def database_policy_spec(request: DiscoveryRequest) -> net.NetworkPolicySpecArgs:
    """The stack's PostgreSQL pod: only the service's pods, on its port; it
    reaches nothing."""
    return net.NetworkPolicySpecArgs(
        pod_selector=meta.LabelSelectorArgs(match_labels=selector(request, "database")),
        policy_types=["Ingress", "Egress"],
        ingress=[
            net.NetworkPolicyIngressRuleArgs(
                from_=[
                    net.NetworkPolicyPeerArgs(
                        pod_selector=meta.LabelSelectorArgs(
                            match_labels=selector(request, "discovery")
                        )
                    )
                ],
                ports=[net.NetworkPolicyPortArgs(protocol="TCP", port=POSTGRES_PORT)],
            )
        ],
        egress=[],
    )
