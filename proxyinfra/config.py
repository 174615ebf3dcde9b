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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
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


class GcpProvider(Model):
    project: Annotated[str, Field(min_length=1)]
    region: Annotated[str, Field(min_length=1)]
    zones: list[str] = Field(default_factory=list)
    network: str = "default"
    subnetwork: str | None = None
    machine_types: list[str] = Field(default_factory=lambda: ["e2-micro", "e2-small"])
    images: dict[str, str] = Field(
        default_factory=lambda: {
            "debian-12": "projects/debian-cloud/global/images/family/debian-12"
        }
    )
    boot_disk_size_gb: Annotated[int, Field(ge=10)] = 10
    static_ip: bool = False


# --- kubernetes --------------------------------------------------------------


class KubernetesProvider(Model):
    namespace: Name = "egress-proxies"
    kubeconfig: str | None = None
    context: str | None = None
    image: str = "ubuntu/squid:5.7-22.10_beta"
    service_type: Literal["ClusterIP", "LoadBalancer", "NodePort"] = "ClusterIP"
    cpu_request: str = "50m"
    cpu_limit: str = "500m"
    memory_request: str = "64Mi"
    memory_limit: str = "256Mi"


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
