"""Stack config models (namespace ``egress-proxies``): the parts every backend
shares.

Shapes only: each model parses one block of ``Pulumi.<stack>.yaml`` with its
defaults and rejects unknown keys. A backend's own block (``kvm``, ``gcp``,
...) is its package's model (``providers/<name>/config.py``), a subclass of
:class:`ProviderEntry`. Rules that span blocks live in
:mod:`proxyinfra.validation` and in each backend's checks.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel
from pydantic.alias_generators import to_camel

from proxyinfra.generations import FIRST, replica_name
from proxyinfra.printable import Value

if TYPE_CHECKING:  # the policy's models build on this module's Model
    from proxyinfra.autopilot.policy import AutopilotPolicy
    from proxyinfra.discovery_config import DiscoveryConfig

NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$"
"""Logical names end up in libvirt, GCP and Kubernetes names: DNS-label rules."""


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


def _percent(value: str) -> str:
    if re.fullmatch(r"(100|[1-9][0-9]?)%", value) is None:
        raise ValueError("not a count (1-1000) or a percentage of the replicas (1%-100%)")
    return value


Percent = Annotated[str, AfterValidator(_percent)]
Port = Annotated[int, Field(ge=1, le=65535)]


class ProviderEntry(Model):
    """One entry of ``providers``: a name, a type, and the type's own block,
    declared by the backend's subclass (``type: Literal["kvm"]``, ``kvm: ...``)."""

    name: Name
    type: str


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
    # Values as the manifest takes them (proxyinfra/printable.py): refused here,
    # not in the middle of `pulumi up`.
    labels: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], Value] = Field(
        default_factory=dict
    )
    user_data: str | None = None
    url: str | None = None
    # How many replicas a change may take down at once (proxyinfra/rollout.py).
    max_unavailable: Annotated[int, Field(ge=1, le=1000)] | Percent | None = None

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


# --- generations ---------------------------------------------------------------

# A name's `-g<N>` stays short: entry (40) + `-999` + `-g1000000` fits the
# 63 characters of a Kubernetes or GCP label value.
MAX_GENERATION = 1_000_000
Generation = Annotated[int, Field(strict=True, ge=FIRST, le=MAX_GENERATION)]


class Generations(RootModel[dict[str, Generation]]):
    """``egress-proxies:generations``: a replica's slot (its generation-1 name,
    ``home-0``) -> its generation (absent: 1). Strict integers: ``"2"`` or
    ``2.5`` is refused, not guessed. The cross-checks (slots that exist,
    backends that can give a new address) are proxyinfra/generation_checks.py's."""

    model_config = ConfigDict(frozen=True)


# --- the whole config ----------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    """One proxy instance: a replica of a `proxies[]` entry, in its slot
    (``home-0``; an external entry's own name) at its generation. Its name,
    from which its id, MAC, machine and resource names all follow, is the
    slot at generation 1 and ``<slot>-g<N>`` after (proxyinfra/generations.py)."""

    slot: str
    entry: ProxyEntry
    index: int  # position of the entry in `proxies`
    provider: ProviderEntry
    ordinal: int = 0  # which replica of the entry: the N of home-N
    generation: int = FIRST

    @property
    def name(self) -> str:
        """The logical replica name, e.g. home-0, home-0-g2."""
        return replica_name(self.slot, self.generation)


@dataclass(frozen=True)
class StackConfig:
    providers: dict[str, ProviderEntry]
    proxies: list[ProxyEntry]
    squid: Squid
    base_dir: Path
    warnings: list[str] = field(default_factory=list)
    replica_lists: dict[str, list[str]] = field(default_factory=dict)  # proxy entry -> slots
    autopilot: AutopilotPolicy | None = None  # the block `egress-proxies:autopilot`, if any
    # Slot -> generation (>= 1), as validated; a slot not listed is at 1.
    generations: dict[str, int] = field(default_factory=dict)
    discovery: DiscoveryConfig | None = None  # the block `egress-proxies:discovery`, if any

    def replicas(self) -> list[Replica]:
        return [
            Replica(
                slot,
                entry,
                index,
                self.providers[entry.provider],
                ordinal,
                self.generations.get(slot, FIRST),
            )
            for index, entry in enumerate(self.proxies)
            for ordinal, slot in enumerate(self.replica_lists[entry.name])
        ]


def replica_names(entry: ProxyEntry, provisions: bool) -> list[str]:
    """The slots of a proxies[] entry (its replicas' generation-1 names):
    ``<name>-0`` ... for provisioned proxies, the entry's own name for one
    that exists already."""
    if not provisions:
        return [entry.name]
    return [f"{entry.name}-{i}" for i in range(entry.replica_count)]


def resolve_path(value: str, base_dir: Path) -> Path:
    """Config paths: `~` expanded, relative ones taken from the project directory."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else base_dir / path
