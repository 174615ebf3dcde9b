"""``egress-proxies:discovery`` against the rest of the config: the provider
entry it names is a kubernetes one, its ports are apart from each other and
from the proxies' (squid.port), someone is admitted to them, and a NodePort
Service says which address reaches a node. Each problem names its path."""

from __future__ import annotations

import re

from proxyinfra.checks import Report
from proxyinfra.config import ProviderEntry, Squid
from proxyinfra.discovery_config import DiscoveryConfig

KUBERNETES = "kubernetes"


def check_discovery(
    discovery: DiscoveryConfig,
    providers: dict[str, ProviderEntry],
    broken_providers: set[str],
    squid: Squid | None,
    c: Report,
) -> None:
    name = discovery.provider
    entry = providers.get(name)
    if entry is None and name not in broken_providers:
        kubernetes = [p.name for p in providers.values() if p.type == KUBERNETES]
        known = ", ".join(kubernetes) or "none defined"
        c.add("discovery.provider", f"unknown provider {name!r} (kubernetes providers: {known})")
    elif entry is not None and entry.type != KUBERNETES:
        c.add(
            "discovery.provider",
            f"{name!r} is {'an' if entry.type[0] in 'aeiou' else 'a'} {entry.type} provider; "
            "the discovery service runs on a "
            "kubernetes provider entry",
        )
    ports = {"discovery.port": discovery.port}
    if discovery.gateway is not None:
        ports["discovery.gateway.port"] = discovery.gateway.port
        if discovery.gateway.port == discovery.port:
            c.add("discovery.gateway.port", f"{discovery.port} is discovery.port already")
    if squid is not None:
        for path, port in ports.items():
            if port == squid.port:
                c.add(path, f"{port} is the proxies' port (squid.port); pick another")
    if not discovery.allowed_clients and not discovery.client_namespaces:
        c.add(
            "discovery.allowedClients",
            "required (or clientNamespaces): the CIDRs of the crawlers that may reach the "
            "service; its NetworkPolicy would otherwise admit no one",
        )
    service = discovery.service
    if service.type == "NodePort" and not service.node_address:
        c.add("discovery.service.nodeAddress", "required with type NodePort: the URL's host")
    if service.type != "NodePort" and service.node_address:
        c.add("discovery.service.nodeAddress", f"only with type NodePort (type is {service.type})")
    for what, image in _images(discovery):
        if re.search(r"@sha256:[0-9a-f]{64}$", image) is None:
            c.warnings.append(
                f"{what} {image!r} is not pinned (no @sha256 digest): a tag can move, so pods "
                "may run an image nobody reviewed"
            )


def _images(discovery: DiscoveryConfig) -> list[tuple[str, str]]:
    images = [("discovery.image", discovery.image)]
    if discovery.database.postgres is not None:
        images.append(("discovery.database.postgres.image", discovery.database.postgres.image))
    return images
