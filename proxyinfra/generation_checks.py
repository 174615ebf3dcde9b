"""``egress-proxies:generations`` against the rest of the config: each key is
the slot of a replica the stack provisions, on a backend where a new
generation is a new egress address.

- A slot of a ``proxies[]`` entry beyond its ``replicas`` is a warning, not
  an error: scaling a group down leaves its slots' generations behind, and
  the stack must still run (the generation applies again if it grows back).
- An ``external`` proxy is refused: the project did not make it and cannot
  renumber it; it can only be taken out of rotation.
- A kubernetes proxy is refused unless its provider is listed in
  ``autopilot.recycle.egressPerPod``: a new pod leaves through its node's
  address, so a new generation would change names and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from proxyinfra.checks import Report
from proxyinfra.config import ProviderEntry, ProxyEntry
from proxyinfra.generations import FIRST, group_of, parse_name, replica_name
from proxyinfra.registry import backends

KUBERNETES = "kubernetes"
# A slot's ordinal as replica_names writes it: no sign, no leading zero.
_ORDINAL = re.compile(r"0|[1-9][0-9]{0,2}")
_SHOWN = 40


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")


def check_generations(
    generations: Mapping[str, int],
    proxies: Sequence[tuple[int, ProxyEntry]],
    listed: Sequence[str],
    providers: Mapping[str, ProviderEntry],
    slots: Mapping[str, list[str]],
    egress_per_pod: Sequence[str] | None,
    c: Report,
) -> dict[str, int]:
    """The generations that apply, errors and warnings by path into C.

    ``listed``: every ``proxies[]`` name, broken entries included (a key of
    one is not reported again); ``slots``: each usable entry's slots
    (validation's replica lists); ``egress_per_pod``: None when the
    autopilot block did not parse (its errors are listed: not judged here).
    """
    entries = {p.name: p for _, p in proxies}
    made = {slot for names in slots.values() for slot in names}
    kept: dict[str, int] = {}
    for key, generation in generations.items():
        path = f"generations.{key}"
        slot, already = parse_name(key)
        if already > FIRST:
            c.add(
                path,
                f"{_shown(key)} is generation {already} of {slot!r}: a key is a slot, "
                f"the replica's generation-1 name ({slot!r})",
            )
            continue
        group = key if key in entries else group_of(key)
        entry = entries.get(group)
        if entry is None:
            if group not in listed:
                known = ", ".join(entries) or "none defined"
                c.add(path, f"no such replica: no proxies[] entry {group!r} (proxies: {known})")
            continue
        provider = providers.get(entry.provider)
        if provider is None:
            continue  # the entry's own error names its provider
        if not backends()[provider.type].provisions:
            c.add(
                path,
                f"{entry.name!r} is an {provider.type} proxy: external proxies are never "
                "recycled (the project did not make them and cannot give them a new "
                "address); take them out of rotation instead",
            )
            continue
        ordinal = key[len(group) + 1 :] if key != group else ""
        if key == group or not _ORDINAL.fullmatch(ordinal):
            c.add(
                path,
                f"no such replica ({entry.name} has {entry.replica_count}: "
                f"{_span(slots.get(entry.name, []))})",
            )
            continue
        if provider.type == KUBERNETES and (
            egress_per_pod is not None and provider.name not in egress_per_pod
        ):
            c.add(
                path,
                f"{key!r} is a kubernetes proxy (provider {provider.name!r}): a new pod leaves "
                "through its node's address, so a new generation gives no new address; list "
                f"{provider.name!r} in autopilot.recycle.egressPerPod only if this cluster "
                "gives each pod its own egress address",
            )
            continue
        if key not in made:
            c.warnings.append(
                f"{path}: no such replica now ({entry.name} has {entry.replica_count}): "
                f"its generation {generation} applies again if {entry.name} grows back; "
                "remove the key otherwise"
            )
        name = replica_name(key, generation)
        if name != key and name in made:
            c.add(
                path, f"generation {generation} would be named {name!r}, a replica's name already"
            )
            continue
        kept[key] = generation
    return kept


def _span(names: Sequence[str]) -> str:
    if len(names) <= 2:
        return ", ".join(names) or "none"
    return f"{names[0]} ... {names[-1]}"
