"""The planner's output and the memory it carries from round to round.

A change's ``message`` is one line (no control characters, bounded): it
becomes the Pulumi update's message and the decision log's reason, so a site
name from a crawler's report cannot break either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

_SHOWN = 300


def one_line(text: str) -> str:
    """TEXT with every unprintable character (newlines, controls, bidi
    overrides) as '?', cut to a bounded length."""
    line = "".join(ch if ch.isprintable() else "?" for ch in text)
    return line if len(line) <= _SHOWN else line[: _SHOWN - 3] + "..."


NAMED = 5  # names a line that stands for many subjects lists


def some(names: Sequence[str]) -> str:
    """The first NAMED of NAMES, and how many more: a line that stands for
    a thousand proxies stays one line."""
    shown = ", ".join(names[:NAMED])
    return shown + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")


@dataclass(frozen=True)
class Recycle:
    """Replace PROXY by a new one (a new generation, a new address)."""

    group: str
    proxy: str
    rule: str  # "unhealthyFor", "bannedSites" or "maxAge": the policy key that fired
    reason: str

    @property
    def message(self) -> str:
        return one_line(f"autopilot: recycle {self.proxy} ({self.group}): {self.reason}")


@dataclass(frozen=True)
class Scale:
    """Set GROUP's replicas from BEFORE to AFTER."""

    group: str
    before: int
    after: int
    rule: str  # "min", "max", "demand" or "idle"
    reason: str

    @property
    def message(self) -> str:
        return one_line(
            f"autopilot: scale {self.group} from {self.before} to {self.after}: {self.reason}"
        )


Change = Recycle | Scale


@dataclass(frozen=True)
class Held:
    """A change a rule asked for and another rule refused this round (the
    floor, K, room, settling, a backend that cannot give a new address)."""

    subject: str  # a proxy, a group, or "stack" for the whole stack
    rule: str  # the rule that asked
    reason: str  # why not, in one line

    @property
    def message(self) -> str:
        return one_line(f"autopilot: not now: {self.subject}: {self.reason}")


@dataclass(frozen=True)
class GroupMemory:
    """What the planner remembers of one group between rounds."""

    last_change_at: datetime | None = None  # its last planned scale change
    idle_since: datetime | None = None  # first round of its current idle spell


@dataclass(frozen=True)
class PlannerState:
    """The hysteresis state, passed in and handed back: no global, no file
    here (the autopilot command keeps it)."""

    groups: Mapping[str, GroupMemory] = field(default_factory=dict)
    # Per proxy (manifest name) the service judges unhealthy: the first round
    # of its current spell (kept only with recycle.unhealthyFor).
    unhealthy_since: Mapping[str, datetime] = field(default_factory=dict)

    def memory(self, group: str) -> GroupMemory:
        return self.groups.get(group, GroupMemory())


def after(observed: PlannerState, changes: Sequence[Change], now: datetime) -> PlannerState:
    """The next round's state: OBSERVED, with CHANGES (made at NOW) recorded:
    a scaled group's last change, and a recycled proxy's spell over (its
    name has left the fleet). The planner passes every change it plans; the
    round only those whose update went through (a failed scale starts no
    settle, a failed recycle keeps its proxy's spell)."""
    scaled = {c.group for c in changes if isinstance(c, Scale)}
    gone = {c.proxy for c in changes if isinstance(c, Recycle)}
    groups = dict(observed.groups)
    for name in scaled:
        groups[name] = replace(groups.get(name, GroupMemory()), last_change_at=now)
    spells = {n: t for n, t in observed.unhealthy_since.items() if n not in gone}
    return PlannerState(groups, spells)


@dataclass(frozen=True)
class Plan:
    changes: tuple[Change, ...]
    held: tuple[Held, ...]
    # The next round's state once every change is applied; `observed` holds
    # what this round saw without recording a change (for changes that failed).
    state: PlannerState
    observed: PlannerState
