"""The naming rule of proxy generations, once for the stack, the autopilot
and the discovery service (which knows proxies by manifest name only).

A provisioned replica has a *slot*, ``<proxies[] entry>-<ordinal>``
(``home-0``), and a *generation*, 1 unless the stack config's
``egress-proxies:generations`` says otherwise. Its name is the slot itself
at generation 1, so a stack made before generations existed keeps every
name (and every resource), and ``<slot>-g<N>`` from generation 2 on: a
recycle is a new name, hence a new proxy id, MAC, domain, instance and
Pulumi resources (proxyinfra/fleet.py, the backends).

The rule is a bijection: ``replica_name(*parse_name(name)) == name`` for
every name. Only a suffix ``-g<N>`` with N >= 2 written without leading
zeros, after a slot's ``-<ordinal>``, is a generation; any other name is a
slot at generation 1 (``corp-g2``, an ``external`` entry, stays itself).

Pure: no Pulumi, no pydantic, no I/O (the discovery service imports it).
"""

from __future__ import annotations

import re

FIRST = 1
# `<slot>-g<N>`, where the slot ends in `-<ordinal>` and N >= 2 has no leading zero.
_GENERATION = re.compile(r"(?s)(.+-[0-9]+)-g([2-9]|[1-9][0-9]+)")
# `<entry>-<n>`: a replica of a `proxies[]` entry (proxyinfra/config.py, replica_names).
_REPLICA = re.compile(r"(?s)(.+)-[0-9]+")


def replica_name(slot: str, generation: int) -> str:
    """The name of SLOT's replica at GENERATION: the slot itself at 1."""
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < FIRST:
        raise ValueError(f"a generation is an integer >= 1 (got {generation!r})")
    if generation == FIRST:
        return slot
    if _REPLICA.fullmatch(slot) is None or _GENERATION.fullmatch(slot) is not None:
        raise ValueError(f"{slot!r} is no replica slot (<entry>-<n>): only slots have generations")
    return f"{slot}-g{generation}"


def parse_name(name: str) -> tuple[str, int]:
    """(slot, generation) of a replica's name; a name without a generation
    suffix is its own slot, at generation 1."""
    match = _GENERATION.fullmatch(name)
    if match is None:
        return name, FIRST
    return match.group(1), int(match.group(2))


def group_of(name: str) -> str:
    """The `proxies[]` entry a replica belongs to: its slot without the
    trailing ``-<n>``; a name without one (an ``external`` entry's single
    proxy) is its own group. The fleet manifest does not name the entry, so
    this is where every reader derives it."""
    slot, _ = parse_name(name)
    match = _REPLICA.fullmatch(slot)
    return match.group(1) if match else slot
