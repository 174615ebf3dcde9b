"""The kvm provider entry (``type: kvm``): field names, defaults and required
fields of the seed's KVM provider reference (docs/kvm-provider.md)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from providers.kvm.rules import (
    DEFAULT_CPU_MODE,
    DEFAULT_DOMAIN_TYPE,
    DEFAULT_FIRMWARE,
    MIN_MEMORY_MIB,
    DomainType,
    Firmware,
)
from proxyinfra.cloudinit import default_vendor_data
from proxyinfra.config import Model, Name, ProviderEntry

# A script, not #cloud-config: user-data keys replace vendor-data keys
# wholesale, so the agent's `runcmd` and `packages` would be dropped by every
# proxy's own (proxyinfra/cloudinit.py, the one copy).
DEFAULT_VENDOR_DATA = default_vendor_data()


# A suite or component of an apt source line: one word, `$RELEASE` allowed.
APT_WORD = r"^[A-Za-z0-9$][A-Za-z0-9$._/-]*$"
AptWord = Annotated[str, Field(pattern=APT_WORD)]
PGP_PUBLIC_KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


class KvmApt(Model):
    """Where the VMs' apt installs from on first boot (providers/kvm/apt.py
    renders it for cloud-init's apt module); unset, the image's own sources.
    The URLs are checked in providers/kvm/checks.py, whose errors never echo
    them (they could carry credentials)."""

    mirror: str | None = None
    suites: Annotated[list[AptWord], Field(min_length=1)] = ["$RELEASE", "$RELEASE-updates"]
    components: Annotated[list[AptWord], Field(min_length=1)] = ["main"]
    security_mirror: str | None = None
    key: str | None = None
    proxy: str | None = None

    @field_validator("key")
    @classmethod
    def _armored_key(cls, value: str) -> str:
        if not value.startswith(PGP_PUBLIC_KEY):
            raise ValueError(f"must be an ASCII-armored public key ({PGP_PUBLIC_KEY} ...)")
        return value


class KvmImage(Model):
    url: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    format: Literal["qcow2", "raw"] = "qcow2"
    firmware: Firmware = DEFAULT_FIRMWARE
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
    vcpus: Annotated[int, Field(ge=1, le=256)]
    memory_mib: Annotated[int, Field(ge=MIN_MEMORY_MIB, alias="memoryMiB")]


def split_host_port(address: str) -> tuple[str, int]:
    """``nas1.home.lan:22``, ``192.0.2.1:2222`` or ``[2001:db8::1]:22``."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address needs its brackets
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            "must be host:port, such as nas1.home.lan:22 or [2001:db8::1]:22 (SSH port 1-65535)"
        )
    return host, int(port)


def _host_port(value: str) -> str:
    split_host_port(value)
    return value


class KvmHost(Model):
    name: Name
    address: Annotated[str, AfterValidator(_host_port)]
    user: Annotated[str, Field(min_length=1)]
    socket: str = "/var/run/libvirt/libvirt-sock"
    pool: str = "default"
    bridge: str | None = None
    network: str | None = None
    domain_type: DomainType = DEFAULT_DOMAIN_TYPE
    # Checked with libvirt's rules (providers/kvm/rules.py) in providers/kvm/checks.py.
    cpu_mode: str = DEFAULT_CPU_MODE

    @property
    def ssh_host(self) -> str:
        return split_host_port(self.address)[0]

    @property
    def ssh_port(self) -> int:
        return split_host_port(self.address)[1]


class KvmProvider(Model):
    ssh_key_file: str
    known_hosts_file: str | None = None
    insecure_ignore_host_key: bool = False
    disk_size_gb: Annotated[int, Field(ge=1, le=65536)] = 10
    vendor_data: str = DEFAULT_VENDOR_DATA
    ip_timeout_seconds: Annotated[int, Field(ge=1)] = 300
    apt: KvmApt | None = None
    images: dict[str, KvmImage] = Field(default_factory=dict)
    machine_types: dict[str, KvmMachineType] = Field(default_factory=dict)
    hosts: Annotated[list[KvmHost], Field(min_length=1)]


class KvmProviderEntry(ProviderEntry):
    type: Literal["kvm"]
    kvm: KvmProvider
