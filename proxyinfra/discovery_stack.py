"""The discovery service as part of the stack (egress-proxies:discovery):
its generated secrets, the request to the backend that hosts it, and the
outputs a crawler team is given (`discoveryUrl`, `discoveryToken`; the names
are a contract)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import pulumi

from proxyinfra.backend import Deployer, DiscoveryRequest, HostsDiscovery
from proxyinfra.config import StackConfig
from proxyinfra.generated_secret import GeneratedSecret
from proxyinfra.validation import ConfigIssue

URL_OUTPUT = "discoveryUrl"
TOKEN_OUTPUT = "discoveryToken"
TOKEN_BYTES = 32  # 43 URL-safe characters
PASSWORD_BYTES = 24


def proxy_ports(config: StackConfig) -> list[int]:
    """The TCP ports the service reaches proxies on: squid's, and each
    external proxy's own."""
    ports = {config.squid.port}
    for entry in config.proxies:
        if entry.url is not None:
            parts = urlsplit(entry.url)
            try:
                port = parts.port
            except ValueError:
                port = None
            ports.add(port or (443 if parts.scheme == "https" else 80))
    return sorted(ports)


def discovery_issues(config: StackConfig, deployers: Mapping[str, Deployer]) -> list[ConfigIssue]:
    """What the block names on its cluster and is not there (the real
    program only, before any resource: a missing Secret)."""
    discovery = config.discovery
    if discovery is None:
        return []
    provider = config.providers[discovery.provider]
    deployer = deployers[provider.type]
    assert isinstance(deployer, HostsDiscovery), provider.type
    return [
        ConfigIssue(path, problem)
        for path, problem in deployer.discovery_problems(discovery, provider)
    ]


def deploy_discovery(
    config: StackConfig, fleet: pulumi.Output[Any], deployers: Mapping[str, Deployer]
) -> dict[str, pulumi.Output[Any]]:
    """The service's resources, or nothing without the block; its outputs."""
    discovery = config.discovery
    if discovery is None:
        return {}
    provider = config.providers[discovery.provider]
    deployer = deployers[provider.type]
    # Validation admits kubernetes entries only, whose deployer hosts it.
    assert isinstance(deployer, HostsDiscovery), provider.type
    token = None
    if discovery.token.existing_secret is None:
        token = GeneratedSecret("discovery-token", TOKEN_BYTES).value
    password = None
    if discovery.database.postgres is not None:
        password = GeneratedSecret("discovery-database-password", PASSWORD_BYTES).value
    endpoint = deployer.deploy_discovery(
        DiscoveryRequest(
            project=pulumi.get_project(),
            stack=pulumi.get_stack(),
            config=discovery,
            provider=provider,
            fleet=pulumi.Output.secret(fleet),
            token=token,
            database_password=password,
            proxy_ports=proxy_ports(config),
        )
    )
    return {URL_OUTPUT: endpoint.url, TOKEN_OUTPUT: pulumi.Output.secret(endpoint.token)}
