"""The gcp backend of the fleet: per gcp provider entry a pulumi-gcp provider
(project and region from the stack config) and the firewall rules; per proxy
a Compute Instance, and a reserved external address with `staticIp`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from providers.gcp.bootstrap import BOOTSTRAP_KEYS, metadata
from providers.gcp.checks import GcpTargets, gcp_image, gcp_zone
from providers.gcp.config import GcpProviderEntry
from providers.gcp.firewall import firewall_rules
from providers.gcp.labels import network_tag, proxy_labels
from providers.gcp.scheduling import scheduling
from proxyinfra.backend import Endpoint, ProxyRequest
from proxyinfra.rollout import gated


@dataclass(frozen=True)
class _Shared:
    """Per provider entry, made once for all its proxies."""

    provider: gcp.Provider
    tag: str
    firewall: list[gcp.compute.Firewall]


def _external_ip(interfaces: Sequence[gcp.compute.outputs.InstanceNetworkInterface]) -> str:
    configs = (interfaces[0].access_configs or []) if interfaces else []
    ip = configs[0].nat_ip if configs else None
    if not ip:
        raise ValueError("the instance has no external IP address")
    return ip


class GcpDeployer:
    def __init__(self) -> None:
        self._shared: dict[str, _Shared] = {}

    def shared(self, request: ProxyRequest) -> _Shared:
        provider = request.replica.provider
        assert isinstance(provider, GcpProviderEntry)
        if provider.name not in self._shared:
            # An explicit provider: project and region come from the stack
            # config, not from whatever `gcp:project` the shell has set.
            gcp_provider = gcp.Provider(
                provider.name, project=provider.gcp.project, region=provider.gcp.region
            )
            tag = network_tag(request.project, request.stack, provider.name)
            rules = firewall_rules(provider, request.squid, tag, gcp_provider)
            self._shared[provider.name] = _Shared(gcp_provider, tag, rules)
        return self._shared[provider.name]

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint:
        replica = request.replica
        provider = replica.provider
        assert isinstance(provider, GcpProviderEntry)
        config = provider.gcp
        shared = self.shared(request)
        targets = GcpTargets.of(provider)
        placement = replica.entry.placement
        zone = gcp_zone(targets, placement.zone, replica.ordinal)
        image = gcp_image(targets, placement.image)
        assert zone is not None and image is not None  # validation guarantees both
        labels = proxy_labels(request)
        opts = pulumi.ResourceOptions(parent=parent, provider=shared.provider)

        address = None
        if config.static_ip:
            address = gcp.compute.Address(
                f"{replica.name}-address",
                name=request.id,
                region=config.region,
                address_type="EXTERNAL",
                description=f"egress-proxies: external address of proxy {replica.name}",
                labels=labels,
                opts=opts,
            )
        instance = gcp.compute.Instance(
            f"{replica.name}-instance",
            # Held back until the replica before it in its group has its address
            # again: a replacement deletes the instance first (proxyinfra/rollout.py).
            name=gated(request.id, request.after),
            zone=zone,
            machine_type=placement.machine_type,
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                auto_delete=True,
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=image.image, size=config.boot_disk_size_gb, labels=labels
                ),
            ),
            network_interfaces=[
                gcp.compute.InstanceNetworkInterfaceArgs(
                    network=config.network,
                    subnetwork=config.subnetwork,
                    # One access config = an external IP: the proxy's egress
                    # address, and where crawlers connect.
                    access_configs=[
                        gcp.compute.InstanceNetworkInterfaceAccessConfigArgs(
                            nat_ip=address.address if address is not None else None
                        )
                    ],
                )
            ],
            tags=[shared.tag],
            labels=labels,
            scheduling=scheduling(config.provisioning),
            metadata=metadata(request, image),
            # Machine type changes stop and start the VM instead of failing.
            allow_stopping_for_update=True,
            description=f"egress-proxies proxy {replica.name} ({request.project}/{request.stack})",
            opts=pulumi.ResourceOptions.merge(
                opts,
                pulumi.ResourceOptions(
                    # The boot data runs at boot: a change of it needs a new VM
                    # (squid's own keys change in place, applied by the agent
                    # on the VM). The name is fixed, so delete first.
                    replace_on_changes=[f'metadata["{key}"]' for key in BOOTSTRAP_KEYS],
                    delete_before_replace=True,
                    depends_on=list(shared.firewall),
                ),
            ),
        )
        # From the instance even with a static address (its NAT IP is that
        # address): the next replica of a rolling replacement waits for it.
        host = instance.network_interfaces.apply(_external_ip)
        return Endpoint.of(request, host, zone)
