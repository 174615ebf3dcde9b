"""The kubernetes backend of the fleet: per kubernetes provider entry a
pulumi-kubernetes provider (kubeconfig and context from the stack config) and,
unless told otherwise, the namespace; per proxy a ConfigMap with squid.conf,
a Secret with the password hash, a Deployment, a Service and a NetworkPolicy,
all named by the proxy's id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pulumi
import pulumi_kubernetes as k8s
from pulumi.output import UNKNOWN

from providers.kubernetes.config import KubernetesProviderEntry
from providers.kubernetes.container import CONFIG_KEY, PASSWORDS_KEY, container_settings
from providers.kubernetes.labels import (
    PART_OF,
    POD_SECURITY_LABEL,
    STACK_LABEL,
    label_value,
    proxy_labels,
    selector,
)
from providers.kubernetes.network import network_policy_spec, service_spec
from providers.kubernetes.workload import deployment_spec
from proxyinfra.backend import DiscoveryEndpoint, DiscoveryRequest, Endpoint, ProxyRequest
from proxyinfra.config import ProviderEntry, resolve_path
from proxyinfra.discovery_config import DiscoveryConfig
from proxyinfra.squid import password_file_line, render_squid_conf

core = k8s.core.v1
meta = k8s.meta.v1

PATCH_FORCE = "pulumi.com/patchForce"


@dataclass(frozen=True)
class _Shared:
    """Per provider entry, made once for all its proxies."""

    provider: k8s.Provider
    namespace: pulumi.Output[str]


def _load_balancer_address(status: core.outputs.ServiceStatus | None) -> str:
    ingress = status.load_balancer.ingress if status and status.load_balancer else None
    first = ingress[0] if ingress else None
    address = (first.ip or first.hostname) if first else None
    if not address:
        raise ValueError("the LoadBalancer Service has no ingress address")
    return address


def _cluster_ip(spec: core.outputs.ServiceSpec | None) -> pulumi.Input[str]:
    address = spec.cluster_ip if spec else None
    if address and address != "None":
        return address
    if pulumi.runtime.is_dry_run():
        # A preview of a new Service: the API server allocates its IP on create.
        return pulumi.Output.from_input(cast(str, UNKNOWN))
    raise ValueError("the Service has no cluster IP")


class KubernetesDeployer:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._shared: dict[str, _Shared] = {}

    def shared(self, request: ProxyRequest) -> _Shared:
        entry = request.replica.provider
        assert isinstance(entry, KubernetesProviderEntry)
        return self.shared_for(entry, request.stack)

    def deploy_discovery(self, request: DiscoveryRequest) -> DiscoveryEndpoint:
        """The discovery service on its provider entry's cluster and namespace
        (providers/kubernetes/discovery/)."""
        from providers.kubernetes.discovery import deploy

        entry = request.provider
        assert isinstance(entry, KubernetesProviderEntry)
        shared = self.shared_for(entry, request.stack)
        return deploy(request, entry.kubernetes, shared.provider, shared.namespace)

    def discovery_problems(
        self, config: DiscoveryConfig, entry: ProviderEntry
    ) -> list[tuple[str, str]]:
        from providers.kubernetes.discovery.preflight import secret_problems

        assert isinstance(entry, KubernetesProviderEntry)
        return secret_problems(config, entry.kubernetes, self.base_dir)

    def shared_for(self, entry: KubernetesProviderEntry, stack: str) -> _Shared:
        """The provider and namespace of ENTRY, made once for everything on it."""
        if entry.name not in self._shared:
            config = entry.kubernetes
            kubeconfig = (
                str(resolve_path(config.kubeconfig, self.base_dir)) if config.kubeconfig else None
            )
            # An explicit provider: the cluster is the stack config's, not
            # whatever context the shell's kubeconfig has selected.
            provider = k8s.Provider(
                entry.name,
                kubeconfig=kubeconfig,
                context=config.context,
                # A changed squid.conf or password file updates its object in
                # place (the pod rolls through the config hash annotation, the
                # password file is re-read): replacing the ConfigMap or Secret
                # under its fixed name would delete it under a running pod.
                enable_config_map_mutable=True,
                enable_secret_mutable=True,
            )
            namespace: pulumi.Output[str] = pulumi.Output.from_input(config.namespace)
            if config.create_namespace:
                made = core.Namespace(
                    f"{entry.name}-namespace",
                    metadata=meta.ObjectMetaArgs(
                        name=config.namespace,
                        labels={
                            "app.kubernetes.io/part-of": PART_OF,
                            "app.kubernetes.io/managed-by": "pulumi",
                            STACK_LABEL: label_value(stack),
                            # The API server refuses any pod here that is
                            # less locked down than the proxies' are.
                            POD_SECURITY_LABEL: "restricted",
                        },
                    ),
                    opts=pulumi.ResourceOptions(provider=provider),
                )
                # Through the Namespace's output, so everything waits for it.
                namespace = made.metadata.apply(lambda m: m.name or config.namespace)
            self._shared[entry.name] = _Shared(provider, namespace)
        return self._shared[entry.name]

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint:
        replica = request.replica
        entry = replica.provider
        assert isinstance(entry, KubernetesProviderEntry)
        config = entry.kubernetes
        shared = self.shared(request)
        labels = proxy_labels(request)
        # Fixed names (the Service's is in the manifest): a replacement must
        # delete first.
        opts = pulumi.ResourceOptions(
            parent=parent, provider=shared.provider, delete_before_replace=True
        )

        def metadata(name: str) -> meta.ObjectMetaArgs:
            return meta.ObjectMetaArgs(
                name=name,
                namespace=shared.namespace,
                labels=labels,
                # The stack owns these objects: `up` takes back fields another
                # field manager changed (kubectl scale, an edit), where
                # server-side apply would otherwise stop at the conflict.
                annotations={PATCH_FORCE: "true"},
            )

        # The policy first, so the pod is never reachable without it.
        policy = k8s.networking.v1.NetworkPolicy(
            f"{replica.name}-network-policy",
            metadata=metadata(request.id),
            spec=network_policy_spec(request, config, selector(request)),
            opts=opts,
        )
        squid_conf = render_squid_conf(container_settings(request.squid))
        config_map = core.ConfigMap(
            f"{replica.name}-squid-conf",
            metadata=metadata(request.id),
            data={CONFIG_KEY: squid_conf},
            opts=opts,
        )
        waits_for: list[pulumi.Resource] = [policy, config_map]
        secret_name = None
        creds = request.credentials
        if creds is not None:
            secret_name = f"{request.id}-auth"
            # The hash only; the password itself stays in the manifest (secret).
            passwords: pulumi.Output[dict[str, str]] = pulumi.Output.secret(
                creds.password_hash.apply(
                    lambda digest: {PASSWORDS_KEY: password_file_line(creds.username, digest)}
                )
            )
            waits_for.append(
                core.Secret(
                    f"{replica.name}-auth",
                    metadata=metadata(secret_name),
                    type="Opaque",
                    string_data=passwords,
                    opts=opts,
                )
            )
        # The pod mounts the ConfigMap and Secret by name: they must exist first.
        k8s.apps.v1.Deployment(
            f"{replica.name}-deployment",
            metadata=metadata(request.id),
            spec=deployment_spec(request, config, labels, squid_conf, request.id, secret_name),
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=waits_for)),
        )
        service = core.Service(
            f"{replica.name}-service",
            metadata=metadata(request.id),
            spec=service_spec(request, config, selector(request)),
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[policy])),
        )
        if config.service_type == "LoadBalancer":
            host = load_balancer_host(service)
        else:
            host = service_host(service, config.manifest_address, config.cluster_domain)
        return Endpoint.of(request, host, replica.entry.placement.zone)


def service_host(service: core.Service, address: str, domain: str) -> pulumi.Output[str]:
    """How a ClusterIP Service is named to its clients: its cluster DNS name,
    or (manifestAddress clusterIP) its cluster IP."""
    if address == "clusterIP":
        return service.spec.apply(_cluster_ip)
    return service.metadata.apply(lambda m: f"{m.name}.{m.namespace}.svc.{domain}")


def load_balancer_host(service: core.Service) -> pulumi.Output[str]:
    return service.status.apply(_load_balancer_address)
