"""How crawlers reach a proxy pod: its Service, and the NetworkPolicy that
admits only allowedClients (and clientNamespaces) on the proxy port."""

from __future__ import annotations

import pulumi_kubernetes as k8s

from providers.kubernetes.config import KubernetesProvider
from providers.kubernetes.workload import PORT_NAME
from proxyinfra.backend import ProxyRequest
from proxyinfra.clients import client_ranges

core = k8s.core.v1
net = k8s.networking.v1
meta = k8s.meta.v1


def service_spec(
    request: ProxyRequest, k8s_config: KubernetesProvider, selector: dict[str, str]
) -> core.ServiceSpecArgs:
    port = core.ServicePortArgs(
        name=PORT_NAME, port=request.squid.port, target_port=PORT_NAME, protocol="TCP"
    )
    if k8s_config.service_type == "ClusterIP":
        return core.ServiceSpecArgs(type="ClusterIP", selector=selector, ports=[port])
    return core.ServiceSpecArgs(
        type="LoadBalancer",
        selector=selector,
        ports=[port],
        # Local keeps the client's source address: with Cluster the node
        # SNATs it, and squid's ACL and the NetworkPolicy would see node IPs.
        external_traffic_policy="Local",
        # The cloud load balancer's own filter, before traffic reaches a node.
        load_balancer_source_ranges=client_ranges(request.squid.allowed_clients).all,
    )


def network_policy_spec(
    request: ProxyRequest, k8s_config: KubernetesProvider, selector: dict[str, str]
) -> net.NetworkPolicySpecArgs:
    peers = [
        net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=cidr))
        for cidr in client_ranges(request.squid.allowed_clients).all
    ]
    peers += [
        net.NetworkPolicyPeerArgs(
            namespace_selector=meta.LabelSelectorArgs(
                match_labels={"kubernetes.io/metadata.name": namespace}
            )
        )
        for namespace in k8s_config.client_namespaces
    ]
    if not peers:
        # An ingress rule without peers admits every source.
        raise ValueError("no allowedClients: the NetworkPolicy would admit everyone")
    return net.NetworkPolicySpecArgs(
        pod_selector=meta.LabelSelectorArgs(match_labels=selector),
        # Ingress only: squid must reach any site (its own ACL blocks private
        # destinations), so egress stays open.
        policy_types=["Ingress"],
        ingress=[
            net.NetworkPolicyIngressRuleArgs(
                from_=peers,
                ports=[net.NetworkPolicyPortArgs(protocol="TCP", port=request.squid.port)],
            )
        ],
    )
