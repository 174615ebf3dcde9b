"""What the stack holds, as the planner needs it: groups (``proxies[]``
entries), their proxies with the time their current generation was made,
and the room each place has for more.

Capacity is an input (:class:`Room`), never a call to a host: the autopilot
command reads it where the backend knows it (a kvm host's free memory and
pool space, as ``ProxyDomain`` and ``Overlay`` check before creating) and
the planner only does arithmetic on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from proxyinfra.config import StackConfig
from proxyinfra.generations import parse_name

KUBERNETES = "kubernetes"
EXTERNAL = "external"


@dataclass(frozen=True)
class FleetProxy:
    name: str  # as in the manifest, e.g. home-0, home-0-g2
    # When its current generation was made; None where nobody knows (external).
    created_at: datetime | None = None

    @property
    def slot(self) -> str:
        """Its generation-1 name: the key of ``egress-proxies:generations``."""
        return parse_name(self.name)[0]

    @property
    def generation(self) -> int:
        return parse_name(self.name)[1]


@dataclass(frozen=True)
class FleetGroup:
    name: str  # the proxies[] entry
    provider: str  # its providers[] entry
    backend: str  # the provider's type: kvm, gcp, kubernetes, external, ...
    replicas: int
    proxies: tuple[FleetProxy, ...]
    # Where its replicas take room (e.g. "kvm-home/nas1"); None: no limit known
    # to the project (the backend reports none).
    place: str | None = None
    # What one more replica takes there, per resource ({"memory": bytes, ...}).
    needs: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Room:
    """Free resources per place ({"kvm-home/nas1": {"memory": bytes, "disk": bytes}}).
    A place a group names but this lacks has no room: scaling up where the
    room is unknown could pass a host's or a quota's limit."""

    free: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def fits(self, group: FleetGroup, taken: Mapping[str, int]) -> int | None:
        """How many more replicas of GROUP fit, after TAKEN of its place is
        already promised this round; None: no limit."""
        if group.place is None:
            return None
        free = self.free.get(group.place)
        if free is None:
            return 0
        counts = [
            max(0, free.get(resource, 0) - taken.get(resource, 0)) // need
            for resource, need in sorted(group.needs.items())
            if need > 0
        ]
        return min(counts) if counts else None


def groups_of_stack(
    config: StackConfig, created_at: Mapping[str, datetime | None]
) -> list[FleetGroup]:
    """One group per ``proxies[]`` entry, its proxies under their names at
    their current generations (``home-0-g2``, as the manifest and the
    service's signals name them), each made at ``created_at[name]`` (None
    where the caller does not know). Place and needs are left empty: the
    room of a place is the backend's to tell (see Room)."""
    groups: dict[str, list[FleetProxy]] = {}
    for replica in config.replicas():
        groups.setdefault(replica.entry.name, []).append(
            FleetProxy(replica.name, created_at.get(replica.name))
        )
    return [
        FleetGroup(
            name=entry.name,
            provider=entry.provider,
            backend=config.providers[entry.provider].type,
            replicas=len(groups[entry.name]),
            proxies=tuple(groups[entry.name]),
        )
        for entry in config.proxies
    ]
