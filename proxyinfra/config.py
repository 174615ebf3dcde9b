"""Stack config models (namespace ``egress-proxies``).

Shapes only: each model parses one block of ``Pulumi.<stack>.yaml`` with its
defaults and rejects unknown keys. Rules that span blocks (placement, provider
references, files on disk) live in :mod:`proxyinfra.validation`, which also
turns every error into one message with config paths.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)
from pydantic.alias_generators import to_camel

NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$"
"""Logical names end up in libvirt, GCP and Kubernetes names: DNS-label rules."""

DEFAULT_VENDOR_DATA = """\
#cloud-config
packages:
  - qemu-guest-agent
runcmd:
  - [systemctl, enable, --now, qemu-guest-agent]
"""


class Model(BaseModel):
    """Base: camelCase keys as in the YAML, unknown keys are errors, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        str_strip_whitespace=True,
    )


Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Port = Annotated[int, Field(ge=1, le=65535)]


# --- kvm -------------------------------------------------------------------


class KvmImage(Model):
    url: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    format: Literal["qcow2", "raw"] = "qcow2"
    firmware: Literal["uefi", "bios"] = "uefi"
    # The base volume stays in the host's pool after the stack stops using it
    # (destroy, or a new url): a cache for the next `up`. False frees the space.
    keep_on_destroy: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http(s) URL")
        return value


class KvmMachineType(Model):
    cpus: Annotated[int, Field(ge=1, le=256)]
    memory_mb: Annotated[int, Field(ge=128)]


class KvmHost(Model):
    name: Name
    address: Annotated[str, Field(min_length=1)]
    port: Port = 22
    user: Annotated[str, Field(min_length=1)] = "root"
    socket: str = "/var/run/libvirt/libvirt-sock"
    pool: str = "default"
    bridge: str | None = None
    network: str | None = None
    domain_type: Literal["kvm", "qemu"] = "kvm"
    cpu_mode: str = "host-passthrough"


class KvmProvider(Model):
    ssh_key_file: str
    known_hosts_file: str | None = None
    insecure_ignore_host_key: bool = False
    disk_size_gb: Annotated[int, Field(ge=1, le=65536)] = 10
    vendor_data: str = DEFAULT_VENDOR_DATA
    ip_timeout_seconds: Annotated[int, Field(ge=1)] = 300
    images: dict[str, KvmImage] = Field(default_factory=dict)
    machine_types: dict[str, KvmMachineType] = Field(default_factory=dict)
    hosts: Annotated[list[KvmHost], Field(min_length=1)]


# --- gcp -------------------------------------------------------------------

GCP_IMAGE_PATTERN = r"^projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/global/images/(family/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A public (or own) image: ``projects/P/global/images/family/F`` or ``.../images/NAME``."""

# Images from these projects ship cloud-init (reading the `user-data` metadata
# key); Debian's and most others only have Google's guest agent, which runs a
# `startup-script`.
CLOUD_INIT_IMAGE_PROJECTS = ("ubuntu-os-cloud", "ubuntu-os-pro-cloud")

Bootstrap = Literal["cloud-init", "startup-script"]


def _image_shorthand(value: object) -> object:
    # `images: {debian-12: projects/...}` is short for `{image: projects/...}`.
    return {"image": value} if isinstance(value, str) else value


class GcpImage(Model):
    image: Annotated[str, Field(pattern=GCP_IMAGE_PATTERN)]
    # None: cloud-init for the projects in CLOUD_INIT_IMAGE_PROJECTS, else a startup script.
    bootstrap: Bootstrap | None = None

    @property
    def bootstrap_method(self) -> Bootstrap:
        return self.bootstrap or image_bootstrap(self.image)


def image_bootstrap(image: str) -> Bootstrap:
    """How squid gets onto a VM booted from this image path."""
    project = image.split("/")[1] if image.startswith("projects/") else ""
    return "cloud-init" if project in CLOUD_INIT_IMAGE_PROJECTS else "startup-script"


GCP_PROJECT_PATTERN = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
GCP_REGION_PATTERN = r"^[a-z]+-[a-z]+[0-9]+$"


class GcpProvider(Model):
    project: Annotated[str, Field(pattern=GCP_PROJECT_PATTERN)]
    region: Annotated[str, Field(pattern=GCP_REGION_PATTERN)]
    zones: list[str] = Field(default_factory=list)
    network: Annotated[str, Field(min_length=1)] = "default"
    subnetwork: str | None = None
    machine_types: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: ["e2-micro", "e2-small"]
    )
    images: dict[str, Annotated[GcpImage, BeforeValidator(_image_shorthand)]] = Field(
        default_factory=lambda: {
            "debian-12": GcpImage(image="projects/debian-cloud/global/images/family/debian-12")
        }
    )
    boot_disk_size_gb: Annotated[int, Field(ge=10, le=65536)] = 10
    static_ip: bool = False


# --- kubernetes --------------------------------------------------------------

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
    # Namespaces whose pods the NetworkPolicy admits besides allowedClients'
    # CIDRs (some CNIs, e.g. Cilium, do not match pod IPs against ipBlock).
    client_namespaces: list[Name] = Field(default_factory=list)
    cpu_request: Quantity = "50m"
    cpu_limit: Quantity = "500m"
    memory_request: Quantity = "64Mi"
    memory_limit: Quantity = "256Mi"


# --- provider entries --------------------------------------------------------


class KvmProviderEntry(Model):
    name: Name
    type: Literal["kvm"]
    kvm: KvmProvider


class GcpProviderEntry(Model):
    name: Name
    type: Literal["gcp"]
    gcp: GcpProvider


class KubernetesProviderEntry(Model):
    name: Name
    type: Literal["kubernetes"]
    kubernetes: KubernetesProvider


class ExternalProviderEntry(Model):
    """Proxies that exist already: probed and leased, never provisioned."""

    name: Name
    type: Literal["external"]


ProviderEntry = (
    KvmProviderEntry | GcpProviderEntry | KubernetesProviderEntry | ExternalProviderEntry
)

PROVIDER_TYPES: dict[str, type[Model]] = {
    "kvm": KvmProviderEntry,
    "gcp": GcpProviderEntry,
    "kubernetes": KubernetesProviderEntry,
    "external": ExternalProviderEntry,
}


# --- proxies -----------------------------------------------------------------


class Placement(Model):
    zone: str | None = None
    region: str | None = None
    machine_type: str | None = None
    image: str | None = None


class ProxyEntry(Model):
    name: Name
    provider: Annotated[str, Field(min_length=1)]
    replicas: Annotated[int, Field(ge=1, le=1000)] | None = None
    placement: Placement = Field(default_factory=Placement)
    labels: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], str] = Field(
        default_factory=dict
    )
    user_data: str | None = None
    url: str | None = None

    @property
    def replica_count(self) -> int:
        return self.replicas if self.replicas is not None else 1


# --- squid -------------------------------------------------------------------


def _port_range(value: str) -> str:
    low, _, high = value.partition("-")
    if not (low.isdigit() and (high.isdigit() or not high)):
        raise ValueError("not a port or port range such as 443 or 1024-65535")
    lo, hi = int(low), int(high or low)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError("not a port or port range within 1-65535")
    return value


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise ValueError("not a CIDR network (address/prefix, no host bits set)") from None
    return value


PortRange = Annotated[str, AfterValidator(_port_range)]
Cidr = Annotated[str, AfterValidator(_cidr)]


class SquidAuth(Model):
    """Basic auth with a password generated per proxy and kept as a Pulumi secret."""

    username: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] = "crawler"


class Squid(Model):
    port: Port = 3128
    allowed_clients: list[Cidr] = Field(default_factory=list)
    connect_ports: list[PortRange] = Field(default_factory=lambda: ["443"])
    auth: SquidAuth | None = None
    # Destinations squid refuses; None keeps the renderer's default (loopback,
    # link-local/metadata, private ranges). A test network may need [].
    blocked_destinations: list[Cidr] | None = None
    # The name says the risk: without it, 0.0.0.0/0 or ::/0 is refused.
    allow_open_proxy_to_the_internet: bool = False
