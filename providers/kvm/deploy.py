"""The kvm backend of the fleet: per host one BaseImage per image in use; per
proxy an Overlay, a SeedIso and a ProxyDomain, whose address goes into the
manifest. The overlay and the seed take the request's ``after``: their
replacement is what deletes the domain (proxyinfra/rollout.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pulumi

from providers.kvm.access import HostAccess
from providers.kvm.apt import apt_cloud_config
from providers.kvm.baseimage import BaseImage, BaseImageArgs
from providers.kvm.config import KvmHost, KvmImage, KvmProviderEntry
from providers.kvm.domain import DomainArgs, ProxyDomain
from providers.kvm.overlay import Overlay, OverlayArgs
from providers.kvm.seediso import SeedArgs, SeedIso
from providers.kvm.squidfiles import seed_parts
from proxyinfra.backend import Endpoint, ProxyRequest
from proxyinfra.cloudinit import render_meta_data, render_user_data
from proxyinfra.names import overlay_volume, seed_volume
from proxyinfra.squid import password_file_line, render_squid_conf, settings_from_config

SHUTDOWN_TIMEOUT_SECONDS = 60


def host_of(provider: KvmProviderEntry, zone: str | None) -> KvmHost:
    """The host a proxy with placement ZONE lands on (validation: one of the
    provider's, required when it has several)."""
    hosts = provider.kvm.hosts
    return next(h for h in hosts if h.name == zone) if zone else hosts[0]


def _image(provider: KvmProviderEntry, key: str) -> KvmImage:
    # Validation guarantees a key of `images` or an http(s) URL.
    return provider.kvm.images.get(key) or KvmImage(url=key)


class KvmDeployer:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._bases: dict[tuple[str, str, str, str | None], BaseImage] = {}

    def base_image(self, provider: KvmProviderEntry, host: KvmHost, image: KvmImage) -> BaseImage:
        """One per host and image, shared by every proxy on that host."""
        key = (provider.name, host.name, image.url, image.sha256)
        if key not in self._bases:
            access = HostAccess.of(provider, host, self.base_dir)
            digest = hashlib.sha256(f"{image.url}\0{image.sha256}".encode()).hexdigest()[:10]
            self._bases[key] = BaseImage(
                f"{provider.name}-{host.name}-image-{digest}",
                BaseImageArgs.of(
                    access, image.url, image.sha256, image.format, image.keep_on_destroy
                ),
            )
        return self._bases[key]

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint:
        replica = request.replica
        provider = replica.provider
        assert isinstance(provider, KvmProviderEntry)
        placement = replica.entry.placement
        host = host_of(provider, placement.zone)
        access = HostAccess.of(provider, host, self.base_dir)
        image = _image(provider, placement.image or "")
        machine = provider.kvm.machine_types[placement.machine_type or ""]
        base = self.base_image(provider, host, image)
        child = pulumi.ResourceOptions(parent=parent)

        overlay = Overlay(
            f"{replica.name}-overlay",
            OverlayArgs(
                host=access,
                name=overlay_volume(request.id),
                base_path=base.path,
                base_format=image.format,
                size_gb=provider.kvm.disk_size_gb,
            ),
            child,
            after=request.after,
        )
        user_data = self._user_data(request, apt_cloud_config(provider.kvm.apt))
        # A new instance-id with new user-data, so cloud-init runs it again.
        instance_id = user_data.apply(
            lambda text: f"{request.id}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
        )
        seed = SeedIso(
            f"{replica.name}-seed",
            SeedArgs(
                host=access,
                name=seed_volume(request.id),
                user_data=user_data,
                meta_data=instance_id.apply(lambda iid: render_meta_data(iid, request.id)),
                vendor_data=provider.kvm.vendor_data,
            ),
            child,
            after=request.after,
        )
        parts = user_data.apply(lambda text: seed_parts(text, [provider.kvm.vendor_data, None]))
        domain = ProxyDomain(
            f"{replica.name}-domain",
            DomainArgs(
                host=access,
                name=request.id,
                project=request.project,
                stack=request.stack,
                logical_name=replica.name,
                memory_mib=machine.memory_mib,
                vcpus=machine.vcpus,
                domain_type=host.domain_type,
                cpu_mode=host.cpu_mode,
                firmware=image.firmware,
                disk_path=overlay.path,
                seed_path=seed.path,
                base_volume=base.volume,
                seed_sha256=seed.sha256,
                seed_parts=pulumi.Output.secret(parts),
                ip_timeout_seconds=provider.kvm.ip_timeout_seconds,
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_SECONDS,
            ),
            child,
        )
        return Endpoint.of(request, domain.ip, host.name)

    @staticmethod
    def _user_data(request: ProxyRequest, settings: dict[str, Any]) -> pulumi.Output[str]:
        """`settings`: cloud-config of the provider's own settings (apt)."""
        squid_conf = render_squid_conf(settings_from_config(request.squid))
        own = request.replica.entry.user_data
        creds = request.credentials
        if creds is None:
            return pulumi.Output.secret(
                render_user_data(squid_conf, None, own, hostname=request.id, settings=settings)
            )
        return pulumi.Output.secret(
            creds.password_hash.apply(
                lambda digest: render_user_data(
                    squid_conf,
                    password_file_line(creds.username, digest),
                    own,
                    hostname=request.id,
                    settings=settings,
                )
            )
        )
