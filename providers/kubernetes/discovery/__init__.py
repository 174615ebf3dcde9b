"""The discovery service the stack deploys on a kubernetes provider entry
(egress-proxies:discovery; docs/discovery.md "On Kubernetes"): a
ServiceAccount with no permissions, the token Secret (generated) or an
existing one, the fleet manifest as a Secret made from the stack's own
`fleet` output, the database (an existing URL Secret, or the stack's own
PostgreSQL pod), the Deployment, its PodDisruptionBudget, Service and
NetworkPolicy. All in the provider entry's namespace, named
``discovery-<10 hex>`` from project and stack."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from providers.kubernetes.config import KubernetesProvider
from providers.kubernetes.deploy import PATCH_FORCE, load_balancer_host, service_host
from providers.kubernetes.discovery.names import (
    FLEET_KEY,
    TOKEN_KEY,
    URL_KEY,
    base_name,
    labels,
    selector,
)
from providers.kubernetes.discovery.network import network_policy_spec, service_spec
from providers.kubernetes.discovery.pod import deployment_spec
from providers.kubernetes.discovery.postgres import deploy_database
from proxyinfra.backend import FLEET_RESOURCE, DiscoveryEndpoint, DiscoveryRequest

core = k8s.core.v1
meta = k8s.meta.v1


def deploy(
    request: DiscoveryRequest,
    config: KubernetesProvider,
    provider: k8s.Provider,
    namespace: pulumi.Output[str],
) -> DiscoveryEndpoint:
    discovery = request.config
    base = base_name(request)
    # Fixed names: a replacement must delete first.
    opts = pulumi.ResourceOptions(provider=provider, delete_before_replace=True)

    def metadata(name: str, component: str) -> meta.ObjectMetaArgs:
        return meta.ObjectMetaArgs(
            name=name,
            namespace=namespace,
            labels=labels(request, component),
            annotations={PATCH_FORCE: "true"},
        )

    def host_of(service: core.Service) -> pulumi.Output[str]:
        return service_host(service, config.manifest_address, config.cluster_domain)

    policy = k8s.networking.v1.NetworkPolicy(
        "discovery-network-policy",
        metadata=metadata(base, "discovery"),
        spec=network_policy_spec(request),
        opts=opts,
    )
    account = core.ServiceAccount(
        "discovery-service-account",
        metadata=metadata(base, "discovery"),
        automount_service_account_token=False,
        opts=opts,
    )
    waits_for: list[pulumi.Resource] = [policy, account]

    token_ref = discovery.token.existing_secret
    if token_ref is None:
        assert request.token is not None
        token_data: pulumi.Output[dict[str, str]] = pulumi.Output.secret(
            request.token.apply(lambda t: {TOKEN_KEY: t})
        )
        token_secret = core.Secret(
            "discovery-token-secret",
            metadata=metadata(f"{base}-token", "discovery"),
            type="Opaque",
            string_data=token_data,
            opts=opts,
        )
        waits_for.append(token_secret)
        token_source = (f"{base}-token", TOKEN_KEY)
        token: pulumi.Output[str] = request.token
    else:
        token_source = (token_ref.name, token_ref.key)
        token = _read_secret_key(
            "discovery-existing-token", namespace, token_ref.name, token_ref.key, provider
        )

    # The stack's own manifest, passwords and all: a change of the fleet
    # updates this Secret in place and the service reloads it, no restart.
    fleet_data: pulumi.Output[dict[str, str]] = pulumi.Output.secret(
        request.fleet.apply(lambda fleet: {FLEET_KEY: json.dumps(fleet, sort_keys=True)})
    )
    fleet_secret = core.Secret(
        FLEET_RESOURCE,
        metadata=metadata(f"{base}-fleet", "discovery"),
        type="Opaque",
        string_data=fleet_data,
        opts=opts,
    )
    waits_for.append(fleet_secret)

    database_ref = discovery.database.existing_secret
    if database_ref is None:
        database = deploy_database(request, base, metadata, opts, host_of)
        waits_for += database.ready
        database_source = (database.secret, URL_KEY)
    else:
        database_source = (database_ref.name, database_ref.key)

    deployment = k8s.apps.v1.Deployment(
        "discovery-deployment",
        metadata=metadata(base, "discovery"),
        spec=deployment_spec(
            request,
            labels(request, "discovery"),
            base,
            f"{base}-fleet",
            token_source,
            database_source,
        ),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=waits_for)),
    )
    k8s.policy.v1.PodDisruptionBudget(
        "discovery-disruption-budget",
        metadata=metadata(base, "discovery"),
        spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
            # One pod at a time: with 2 or more replicas, one always serves.
            max_unavailable=1,
            selector=meta.LabelSelectorArgs(match_labels=selector(request, "discovery")),
        ),
        opts=opts,
    )
    service = core.Service(
        "discovery-service",
        metadata=metadata(base, "discovery"),
        spec=service_spec(request),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[policy])),
    )
    return DiscoveryEndpoint(url=_url(request, service, host_of, deployment), token=token)


def _url(
    request: DiscoveryRequest,
    service: core.Service,
    host_of: Any,
    deployment: k8s.apps.v1.Deployment,
) -> pulumi.Output[str]:
    settings = request.config.service
    port: pulumi.Input[int] = request.config.port
    if settings.type == "LoadBalancer":
        host = load_balancer_host(service)
    elif settings.type == "NodePort":
        assert settings.node_address is not None
        host = pulumi.Output.from_input(settings.node_address)
        port = service.spec.apply(lambda spec: _node_port(spec, "api"))
    else:
        host = host_of(service)
    shown = host.apply(lambda h: f"[{h}]" if ":" in h else h)
    # After the rollout: a URL in the outputs answers.
    return pulumi.Output.all(shown, port, deployment.metadata).apply(
        lambda hp: f"http://{hp[0]}:{hp[1]}"
    )


def _node_port(spec: Any, name: str) -> int:
    for port in spec.ports if spec else []:
        if port.name == name and port.node_port:
            return int(port.node_port)
    raise ValueError(f"the NodePort Service has no node port for {name!r}")


def _read_secret_key(
    name: str, namespace: pulumi.Output[str], secret: str, key: str, provider: k8s.Provider
) -> pulumi.Output[str]:
    """KEY of an existing Secret, read through the API (a secret Output)."""
    found = core.Secret.get(
        name,
        namespace.apply(lambda ns: f"{ns}/{secret}"),
        opts=pulumi.ResourceOptions(provider=provider),
    )

    def value(data: Mapping[str, str] | None) -> str:
        if not data or key not in data:
            raise ValueError(f"Secret {secret!r} has no key {key!r}")
        return base64.b64decode(data[key]).decode()

    read: pulumi.Output[str] = pulumi.Output.secret(found.data.apply(value))
    return read
