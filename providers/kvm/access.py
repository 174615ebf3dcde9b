"""How to reach one libvirt host: a small picklable value built from config.

Dynamic providers are pickled into state, so they hold this and never an open
connection (see providers.kvm.connection for the per-process pool).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from providers.kvm.config import KvmHost, KvmProviderEntry
from proxyinfra.config import resolve_path

# What a host's settings mostly are, left out of its props: every kvm
# resource keeps them in its inputs and again in its outputs, six copies per
# proxy in the state. Constants of their own, not the config's defaults, so a
# state reads the same whatever later releases make those. A value left out
# means this one (an old state, with every key, reads the same).
LEFT_OUT: dict[str, Any] = {
    "port": 22,
    "insecure_ignore_host_key": False,
    "socket": "/var/run/libvirt/libvirt-sock",
    "pool": "default",
    "known_hosts_file": None,
    "bridge": None,
    "network": None,
}


@dataclass(frozen=True)
class HostAccess:
    provider: str
    host: str
    address: str
    port: int
    user: str
    key_file: str
    known_hosts_file: str | None
    insecure_ignore_host_key: bool
    socket: str
    pool: str
    bridge: str | None
    network: str | None

    @property
    def where(self) -> str:
        """How errors and log lines name the host."""
        return f"host {self.host!r} ({self.user}@{self.address}:{self.port}, provider {self.provider!r})"

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH's known_hosts uses for this address and port."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @classmethod
    def of(cls, provider: KvmProviderEntry, host: KvmHost, base_dir: Path) -> HostAccess:
        kvm = provider.kvm
        known = kvm.known_hosts_file
        return cls(
            provider=provider.name,
            host=host.name,
            address=host.ssh_host,
            port=host.ssh_port,
            user=host.user,
            key_file=str(resolve_path(kvm.ssh_key_file, base_dir)),
            known_hosts_file=str(resolve_path(known, base_dir)) if known else None,
            insecure_ignore_host_key=kvm.insecure_ignore_host_key,
            socket=host.socket,
            pool=host.pool,
            bridge=host.bridge,
            network=host.network,
        )

    def to_props(self) -> dict[str, Any]:
        """As a resource input (providers rebuild it with :meth:`from_props`):
        the values that are the ones in LEFT_OUT are left out."""
        return {k: v for k, v in asdict(self).items() if k not in LEFT_OUT or v != LEFT_OUT[k]}

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> HostAccess:
        values: dict[str, Any] = {
            f.name: props.get(f.name, LEFT_OUT.get(f.name)) for f in fields(cls)
        }
        values["port"] = int(values["port"])  # numbers cross the engine as floats
        values["insecure_ignore_host_key"] = bool(values["insecure_ignore_host_key"])
        return cls(**values)
