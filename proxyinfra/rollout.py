"""Rolling changes: a change that replaces a group's proxies takes at most
``maxUnavailable`` of them down at once.

A kvm proxy's machine and volumes, and a gcp proxy's instance, have fixed
names, so a replacement deletes the proxy first (the user's userData, an
image, a machine type: every replica of the group at once; new squid
settings go in place instead, providers/kvm/squidpush.py and
providers/gcp/squid_sync.py). Here each replica waits, before the resources whose
replacement takes it down are registered, until the replica
``maxUnavailable`` places before it in its group has its address: the
engine then replaces the group ``maxUnavailable`` replicas at a time, each
one after the one before it is back. The program cannot tell a new replica
from one being replaced (the stack's last outputs, read by a
StackReference to itself, change under a refresh and cannot be read
during the stack's first update), so a first ``up`` creates a group
``maxUnavailable`` at a time too; an unchanged predecessor answers at once.

The wait is an Output of no value (``""``) without the resources it came
from; a backend holds an input of its own back with it (kvm: the overlay's
and the seed's name, providers.kvm.resource.gated), not a ``dependsOn``: a
dependency the engine records would make a targeted update that deletes
one replica (the autopilot's recycle) delete every replica that depends on
it, and an input that keeps its value changes no diff, so existing stacks
see no change and the state holds nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pulumi

from proxyinfra.config import ProxyEntry, Replica

DEFAULT = "25%"
"""As a Kubernetes Deployment's rolling update, rounded up: one replica of
a group of up to four."""


def max_unavailable(entry: ProxyEntry) -> int:
    """How many of ENTRY's replicas a change may take down at once (at least one)."""
    value = entry.max_unavailable if entry.max_unavailable is not None else DEFAULT
    if isinstance(value, int):
        return value
    return max(1, math.ceil(entry.replica_count * int(value.rstrip("%")) / 100))


def predecessors(replicas: Sequence[Replica]) -> dict[str, str]:
    """Replica name -> the name of the replica it waits for: the one
    ``max_unavailable`` slots before it in its entry; none for the first
    ones of each entry."""
    groups: dict[int, list[Replica]] = {}
    for replica in replicas:
        groups.setdefault(replica.index, []).append(replica)
    waits: dict[str, str] = {}
    for group in groups.values():
        step = max_unavailable(group[0].entry)
        for position, replica in enumerate(group):
            if position >= step:
                waits[replica.name] = group[position - step].name
    return waits


def gate(ready: pulumi.Output[Any] | None) -> pulumi.Output[str]:
    """``""`` once READY (the predecessor's address) is resolved, at once
    without one; with no dependency on the resources READY came from.

    Any value lets the replica go, none too: a preview's unknown, a
    predecessor an ``up --target`` leaves out, and one that failed under
    ``--continue-on-error`` all resolve with no address, and the program
    cannot tell them apart (tests/engine/test_cli_rollout.py)."""

    async def wait() -> str:
        if ready is not None:
            await ready.future()  # unknown in a preview: resolves all the same
        return ""

    return pulumi.Output.from_input(wait())


def gated(value: Any, after: Any | None) -> Any:
    """VALUE (an input), resolved only once AFTER (a ``gate``) is: the program
    registers the resource then. The same value, so no diff sees it, and no
    key of its own in the state; AFTER brings no dependency."""
    if after is None:
        return value
    return pulumi.Output.all(after, value).apply(lambda both: both[1])
