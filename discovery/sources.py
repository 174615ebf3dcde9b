"""Several fleets served as one: `--fleet` and `--stack` given any number of
times (a large fleet split into stacks, docs/discovery.md "Many stacks").

Each source is read on its own schedule (a file when it changed, a stack
every `stack_refresh` seconds) and keeps its last good fleet: a source that
breaks is reported (once per content) and goes on serving what it served,
without hiding the others. With more than one source a proxy's name is
qualified by its manifest's stack (`site-a/home-0`), so names cannot
collide across stacks: a stack's name holds no `/` (Pulumi's rule, which
the manifest's validation holds every fleet to), so `STACK/NAME` is read
back one way only, whatever the proxy's name holds (`a` + `b/c` is never
`a/b` + `c`); two sources of one stack are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from discovery.fleet import Fleet, FleetError, FleetProxy, FleetSource
from discovery.settings import Settings


@dataclass
class _Slot:
    source: FleetSource
    period: float
    fleet: Fleet | None = None  # the last good read
    error: FleetError | None = None  # why the last read failed, while it does
    reported: tuple[str | None] | None = None  # (content,) of the error last reported
    next_read: float = 0.0


@dataclass(frozen=True)
class Reload:
    """What one round of reads found."""

    fleet: Fleet  # the union of every source's last good fleet
    errors: list[str] = field(default_factory=list)  # one per broken source
    new_errors: list[FleetError] = field(default_factory=list)  # not reported before
    recovered: list[str] = field(default_factory=list)  # sources readable again


class FleetSources:
    def __init__(
        self,
        sources: Sequence[FleetSource],
        *,
        file_poll: float,
        stack_refresh: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not sources:
            raise ValueError("give at least one fleet file or stack")
        self._slots = [_Slot(s, stack_refresh if s.polls_command else file_poll) for s in sources]
        self._clock = clock

    @classmethod
    def of(cls, settings: Settings) -> FleetSources:
        sources = [FleetSource(path=path) for path in settings.fleet_files]
        sources += [FleetSource(stack=stack) for stack in settings.stacks]
        return cls(sources, file_poll=settings.file_poll, stack_refresh=settings.stack_refresh)

    @property
    def period(self) -> float:
        """How often the fleet loop should look."""
        return min(slot.period for slot in self._slots)

    def describe(self) -> str:
        return ", ".join(slot.source.describe() for slot in self._slots)

    def load(self) -> Fleet:
        """Reads every source (at start: each must be readable); FleetError
        naming the source that is not."""
        now = self._clock()
        for slot in self._slots:
            try:
                slot.fleet = slot.source.load()
            except FleetError as exc:
                raise _named(exc, slot, len(self._slots)) from None
            slot.next_read = now + slot.period
        return self._union()

    def due(self) -> bool:
        """Whether some source may have something new now."""
        now = self._clock()
        return any(
            slot.error is not None or (now >= slot.next_read and slot.source.changed())
            for slot in self._slots
        )

    def reload(self, *, forced: bool = False) -> Reload:
        """Reads each source that is due (every one when `forced`), keeping a
        broken source's last good fleet. Raises FleetError only when the
        union cannot be made (two sources of one stack)."""
        now = self._clock()
        new_errors: list[FleetError] = []
        recovered: list[str] = []
        for slot in self._slots:
            waiting = now < slot.next_read or not slot.source.changed()
            if not forced and slot.error is None and waiting:
                continue
            slot.next_read = now + slot.period
            try:
                slot.fleet = slot.source.load()
            except FleetError as exc:
                slot.error = _named(exc, slot, len(self._slots))
                if forced or slot.reported != (exc.content,):
                    slot.reported = (exc.content,)
                    new_errors.append(slot.error)
                continue
            if slot.error is not None:
                recovered.append(slot.source.describe())
            slot.error = slot.reported = None
        errors = [str(slot.error) for slot in self._slots if slot.error is not None]
        return Reload(self._union(), errors, new_errors, recovered)

    def _union(self) -> Fleet:
        fleets = [slot.fleet for slot in self._slots if slot.fleet is not None]
        if len(self._slots) == 1:
            return fleets[0]
        seen: dict[str, str] = {}
        proxies: dict[str, FleetProxy] = {}
        for slot in self._slots:
            fleet = slot.fleet
            if fleet is None:
                continue
            where = slot.source.describe()
            if fleet.stack in seen:
                raise FleetError(
                    f"{where} and {seen[fleet.stack]} are both fleets of stack "
                    f"{fleet.stack!r}: give each stack once"
                )
            seen[fleet.stack] = where
            for name, proxy in fleet.proxies.items():
                qualified = f"{fleet.stack}/{name}"
                proxies[qualified] = replace(proxy, name=qualified)
        projects = sorted({f.project for f in fleets})
        return Fleet(",".join(projects), ",".join(f.stack for f in fleets), proxies)


def _named(exc: FleetError, slot: _Slot, sources: int) -> FleetError:
    """The error, prefixed with its source when there are several."""
    if sources == 1:
        return exc
    named = FleetError(f"{slot.source.describe()}: {exc}")
    named.content = exc.content
    return named


__all__ = ["FleetSources", "Reload"]
