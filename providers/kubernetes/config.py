"""The kubernetes provider entry (``type: kubernetes``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from proxyinfra.config import Model, Name, ProviderEntry

# Canonical's squid image (squid 6 on Ubuntu 24.04). The tag alone moves with
# Ubuntu's security updates and old tags get deleted; the digest fixes the
# exact image that was tested and reviewed.
DEFAULT_SQUID_IMAGE = (
    "ubuntu/squid:6.6-24.04_edge"
    "@sha256:8a3baed477e2c282ab8aa5edad442f69873246964f225c5c2ae8364b6610963c"
)
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
IMAGE_REF_PATTERN = r"^[^\s]+$"
DOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class KubernetesProvider(Model):
    namespace: Name = "egress-proxies"
    # True: the stack creates (and on destroy deletes) the namespace; False: it
    # must exist, e.g. made by the cluster's admins.
    create_namespace: bool = True
    kubeconfig: str | None = None
    context: str | None = None
    image: Annotated[str, Field(pattern=IMAGE_REF_PATTERN)] = DEFAULT_SQUID_IMAGE
    # NodePort is left out on purpose: no single address would reach the proxy.
    service_type: Literal["ClusterIP", "LoadBalancer"] = "ClusterIP"
    cluster_domain: Annotated[str, Field(pattern=DOMAIN_PATTERN)] = "cluster.local"
    # The manifest's host of a ClusterIP Service: its cluster DNS name, which
    # resolves inside the cluster only, or its cluster IP, which reaches the
    # pod from the nodes (kube-proxy) and from networks routed to them.
    manifest_address: Literal["serviceDNS", "clusterIP"] = "serviceDNS"
    # Namespaces whose pods the NetworkPolicy admits besides allowedClients'
    # CIDRs (some CNIs, e.g. Cilium, do not match pod IPs against ipBlock).
    client_namespaces: list[Name] = Field(default_factory=list)
    cpu_request: Quantity = "50m"
    cpu_limit: Quantity = "500m"
    memory_request: Quantity = "64Mi"
    memory_limit: Quantity = "256Mi"


class KubernetesProviderEntry(ProviderEntry):
    type: Literal["kubernetes"]
    kubernetes: KubernetesProvider
