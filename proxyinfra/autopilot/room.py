"""The room of each place, read for the planner (fleet.py's ``Room``), and the
groups placed where their backend knows one.

Per group the policy may scale (``scale.groups``), its backend says where its
replicas go and what one more takes there (``proxyinfra.backend.KnowsRoom``:
kvm, a host's memory and pool space as its own creates check them); the free
room of each such place is read once a round from the place itself. A place
that cannot be read gets no room, so the planner refuses to scale up there
(scaling up blind is how a host's memory or a quota is passed), and the
reason, naming the place, is a ``held`` line of the decision log. Groups of
backends that know no room (gcp, kubernetes, external) get no place: no
limit but ``max`` (docs/autopilot.md, "Room").

The conversion from the places' answers to the planner's input is pure
(:func:`room_from`); :class:`BackendRoom` is the one part that reaches a host.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from proxyinfra.autopilot.changes import Held
from proxyinfra.autopilot.fleet import FleetGroup, Room
from proxyinfra.backend import KnowsRoom, Place, RoomUnknown
from proxyinfra.config import ProxyEntry, StackConfig
from proxyinfra.registry import backends

ROOM_RULE = "room"  # the `rule` of the held line of a place whose room is unknown


@dataclass(frozen=True)
class RoomRead:
    groups: tuple[FleetGroup, ...]  # as given, each with its place and needs where known
    room: Room
    held: tuple[Held, ...]  # one per place whose room could not be read


class RoomSource(Protocol):
    def read(
        self, config: StackConfig, groups: Sequence[FleetGroup], scaled: Collection[str]
    ) -> RoomRead:
        """GROUPS placed, and the room of the places of those named in SCALED."""


def room_from(
    groups: Sequence[FleetGroup],
    places: Mapping[str, Place],
    answers: Mapping[str, Mapping[str, int] | RoomUnknown],
) -> RoomRead:
    """GROUPS, each one PLACES names (by group) placed there; the room of each
    place its answer gives (free bytes per resource), none for a place whose
    answer is an error (it is then held, with the error's words)."""
    placed = tuple(
        replace(g, place=places[g.name].name, needs=dict(places[g.name].needs))
        if g.name in places
        else g
        for g in groups
    )
    free = {
        name: {resource: int(amount) for resource, amount in answer.items()}
        for name, answer in sorted(answers.items())
        if not isinstance(answer, RoomUnknown)
    }
    held = tuple(
        Held(
            name,
            ROOM_RULE,
            f"its room could not be read ({answer}): no scale-up there until it can "
            "(scaling up blind could pass its limit)",
        )
        for name, answer in sorted(answers.items())
        if isinstance(answer, RoomUnknown)
    )
    return RoomRead(placed, Room(free), held)


class BackendRoom:
    """The room as the stack's backends read it, each place once a round."""

    def read(
        self, config: StackConfig, groups: Sequence[FleetGroup], scaled: Collection[str]
    ) -> RoomRead:
        known = backends()
        entries = {entry.name: entry for entry in config.proxies}
        places: dict[str, Place] = {}
        first: dict[str, tuple[KnowsRoom, ProxyEntry]] = {}  # place -> how to read it
        for group in groups:
            backend = known.get(group.backend)
            if group.name not in scaled or not isinstance(backend, KnowsRoom):
                continue
            entry = entries[group.name]
            place = backend.place(entry, config.providers[group.provider])
            places[group.name] = place
            first.setdefault(place.name, (backend, entry))
        answers: dict[str, Mapping[str, int] | RoomUnknown] = {}
        for name, (reader, entry) in first.items():
            try:
                answers[name] = reader.free(
                    entry, config.providers[entry.provider], config.base_dir
                )
            except RoomUnknown as unknown:
                answers[name] = unknown
        return room_from(groups, places, answers)
