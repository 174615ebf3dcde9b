"""A planned change as the stack takes it: one config edit (the contract
with the stack program: ``generations.<slot>`` for a recycle,
``proxies[i].replicas`` for a scale) and the URNs its update is targeted
at, so that it costs what it changes, not the whole stack
(docs/architecture.md, "The autopilot's targeted updates").

Targets name ``Proxy`` components only, the replicas that leave and those
that come; the update runs with ``target_dependents`` so each one's children
(volumes, domain, credentials) follow it, the ones it creates included,
whose URNs are not known before the program registers them. The root stack
is targeted implicitly by the engine (3.274: providers and the root stack
always are), so its ``fleet`` output, the manifest the discovery service
reads, is written by the targeted update too.

A recycle for being down (``unhealthyFor``) refreshes the leaving proxy
first: its component, its descendants and their providers, named one by one
(what died may be gone, and a delete of what is gone fails on some
providers).

An update whose creates are all of a backend that takes over what a killed
run left (kvm: fixed names) writes the state once, at its end, instead of
after every step (``PULUMI_SKIP_CHECKPOINTS``): on a file backend each
checkpoint rewrites the whole state, which made a recycle's cost grow with
the stack (docs/autopilot.md, "Cost measured").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from proxyinfra.autopilot.changes import Change, Recycle
from proxyinfra.autopilot.fleet import FleetGroup, groups_of_stack
from proxyinfra.autopilot.seam import Deployed
from proxyinfra.backend import FLEET_RESOURCE
from proxyinfra.config import StackConfig
from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.generations import parse_name, replica_name
from proxyinfra.registry import backends


@dataclass(frozen=True)
class Edit:
    path: str  # a Pulumi config path under egress-proxies:
    before: int | None  # as the file holds it (None: absent)
    after: int
    targets: tuple[str, ...]
    proxies: tuple[str, ...]  # the replicas that leave, then those that come
    registers: tuple[str, ...]  # the replicas the update's partial run registers: those that come
    # Whether the engine must write the state after each step: False when
    # every resource it creates is taken over by a rerun after a kill.
    checkpoints: bool = True
    # Refreshed before the update (with their children): a proxy replaced for
    # being down may be gone already (a VM that died, a GCP Spot VM deleted
    # when preempted), and a delete of what is gone fails on some providers
    # (pulumi-gcp's instance: a 404). The refresh drops it from the state.
    refresh: tuple[str, ...] = ()


def proxy_urn(stack: str, project: str, name: str) -> str:
    """The URN of replica NAME's ``Proxy`` component (a child of the root stack)."""
    return f"urn:pulumi:{stack}::{project}::{PROXY_TYPE}::{name}"


def created_times(deployed: Deployed) -> dict[str, datetime | None]:
    """Each deployed replica's name -> when its ``Proxy`` component was made:
    a generation's birth (a recycle makes a new component)."""
    return {r.urn.rsplit("::", 1)[1]: r.created for r in deployed.resources if r.type == PROXY_TYPE}


def fleet_groups(config: StackConfig, deployed: Deployed) -> list[FleetGroup]:
    return groups_of_stack(config, created_times(deployed))


def _generations(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    found = raw.get("generations")
    return found if isinstance(found, Mapping) else {}


def _with_children(urns: tuple[str, ...], deployed: Deployed) -> tuple[str, ...]:
    """URNS, their descendants in the state, and the providers those use: a
    targeted refresh loads no provider it is not given (3.274: "unknown
    provider"), and its --target-dependents would take every resource of
    a provider given, so each is named instead."""
    found = list(urns)
    for urn in found:  # grows as children are found: breadth first
        found += [r.urn for r in deployed.resources if r.parent == urn and r.urn not in found]
    mine = set(found)
    providers = sorted(
        {
            r.provider.rsplit("::", 1)[0]
            for r in deployed.resources
            if r.urn in mine and r.provider is not None
        }
    )
    return (*found, *providers)


def edit_for(
    change: Change, config: StackConfig, deployed: Deployed, project: str, stack: str
) -> Edit:
    """The edit and targets of CHANGE on a stack whose validated config is
    CONFIG (DEPLOYED: the file's keys as written, and the state).

    A replica that leaves is targeted only when the state holds it: the
    engine refuses a target that neither the state nor the program has
    ("could not be found in the stack"); one that comes always is (the
    program registers it)."""
    raw = deployed.config
    held = {r.urn for r in deployed.resources}
    # The manifest a discovery service the stack runs reads: it changes with the fleet.
    carriers = tuple(sorted(u for u in held if u.rsplit("::", 1)[1] == FLEET_RESOURCE))

    def urn(name: str) -> str:
        return proxy_urn(stack, project, name)

    generations = _generations(raw)
    index = next(i for i, entry in enumerate(config.proxies) if entry.name == change.group)
    provider = config.providers[config.proxies[index].provider]
    checkpoints = not backends()[provider.type].adopts_leftovers
    if isinstance(change, Recycle):
        slot, generation = parse_name(change.proxy)
        new = replica_name(slot, generation + 1)
        before = generations.get(slot)
        leaving = (urn(change.proxy),) if urn(change.proxy) in held else ()
        return Edit(
            f"generations.{slot}",
            before if isinstance(before, int) else None,
            generation + 1,
            (*leaving, urn(new), *carriers),
            (change.proxy, new),
            (new,),
            checkpoints,
            _with_children(leaving, deployed) if change.rule == "unhealthyFor" else (),
        )
    raw_entry = raw["proxies"][index]
    before = raw_entry.get("replicas") if isinstance(raw_entry, Mapping) else None
    low, high = sorted((change.before, change.after))
    names = tuple(
        replica_name(slot, int(generations.get(slot, 1)))
        for slot in (f"{change.group}-{i}" for i in range(low, high))
    )
    shrinks = change.after < change.before
    targets = tuple(urn(n) for n in names if not shrinks or urn(n) in held)
    return Edit(
        f"proxies[{index}].replicas",
        before if isinstance(before, int) else None,
        change.after,
        (*targets, *carriers) if targets else (),
        names,
        () if shrinks else names,
        checkpoints,
    )
