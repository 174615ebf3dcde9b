"""The service's configuration, as given on the command line (see cli.py)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from discovery.database import Database

DEFAULT_PROBE_TARGET = "example.com:443"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class GatewaySettings:
    """The forward-proxy listener (`--gateway`; docs/gateway.md)."""

    host: str
    port: int
    allow: tuple[Network, ...] = ()  # admitted without credentials (--gateway-allow)
    per_site: int = 4  # leases a holder's site set holds at most
    idle_release: float = 60.0  # seconds a session's or site set's lease is kept unused
    holder_leases: int = 64  # leases one holder may hold through the gateway
    max_tunnels: int = 4096  # open tunnels at once (each holds two descriptors)
    holder_tunnels: int = 1024  # open tunnels of one holder
    tunnel_idle: float = 300.0  # a tunnel that moves no byte this long is closed
    # A squid's answer head to a request or CONNECT (it reaches the site first):
    # then the client gets a 504, and the proxy is not blamed (upstream.py).
    answer_timeout: float = 30.0
    max_body: int = 16 * 1024 * 1024  # plain HTTP request bodies are read whole


@dataclass(frozen=True)
class Settings:
    listen_host: str
    listen_port: int
    db: Database  # an SQLite file, or a PostgreSQL URL shared by replicas
    # Where the fleet comes from: any number of manifest files and stacks
    # (several: served as one, names qualified by stack; sources.py).
    fleet_files: tuple[Path, ...] = ()
    stacks: tuple[str, ...] = ()
    # Tried in turn by each probe until one is reached (health/targets.py).
    probe_targets: tuple[str, ...] = (DEFAULT_PROBE_TARGET,)
    probe_interval: float = 10.0
    lease_cooldown: float = 600.0
    max_lease_ttl: float = 300.0
    health_workers: int = 256
    token: str | None = field(default=None, repr=False)
    allow_remote_without_token: bool = False
    stack_refresh: float = 60.0  # seconds between `pulumi stack output` runs
    file_poll: float = 1.0  # seconds between looks at the fleet file
    gateway: GatewaySettings | None = None

    @property
    def fleet_file(self) -> Path | None:
        """The first fleet file, if any (most services have one source)."""
        return self.fleet_files[0] if self.fleet_files else None

    @property
    def stack(self) -> str | None:
        return self.stacks[0] if self.stacks else None


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host_port(value: str) -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port); ValueError with a message otherwise."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{value!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{value!r}: port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 address as [ADDRESS]:PORT")
    return host, port
