"""The planner: signals, the fleet, the policy, the room, the last round's
state and a time in; a plan out. Pure and deterministic: no clock, no I/O,
no global; the same inputs give the same plan, in the same order.

The rules, each once:

- **unhealthyFor**, **bannedSites**, **maxAge**: the recycle rules
  (proxyinfra/autopilot/recycling.py).
- **min / max**: a group outside its bounds is brought into them first.
- **demand**: unmet grants at least ``unmetPerMinute`` scale a group up by
  ``step``, within ``max`` and the room of its place.
- **idle**: no unmet grant and a free proxy for ``idleAfter`` scale it down
  by ``step``, never below ``min`` or the proxies leased now.
- **settle** (hysteresis): no demand or idle change of a group within
  ``settle`` of its last one; between the up threshold and idleness nothing
  moves.
- At most ``maxChangesPerRound`` changes, taken in this order: recycles of
  unhealthy proxies (longest first; a proxy down serves nobody), ban
  recycles (most sites, then oldest), scale-ups, age recycles (oldest first),
  scale-downs. A recycle never leaves a group fewer healthy proxies than
  ``healthyFloor``; a group with a recycle this round is not scaled down in it
  (the stack would remove its last replicas, maybe the one just replaced).
  Past the limit, the next five wait in a held line each and the rest in one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from proxyinfra.autopilot.changes import (
    NAMED,
    Change,
    GroupMemory,
    Held,
    Plan,
    PlannerState,
    Recycle,
    Scale,
    after,
    some,
)
from proxyinfra.autopilot.fleet import FleetGroup, Room
from proxyinfra.autopilot.policy import AutopilotPolicy, ScalePolicy
from proxyinfra.autopilot.policy import format_duration as fmt
from proxyinfra.autopilot.recycling import (
    STACK,
    RecycleWish,
    RecycleWishes,
    recycle_wishes,
    unhealthy_spells,
)
from proxyinfra.autopilot.signals import Signals


@dataclass(frozen=True)
class _ScaleWish:
    group: FleetGroup
    target: int
    change: Scale
    key: tuple[object, ...]


def plan(
    policy: AutopilotPolicy,
    groups: Sequence[FleetGroup],
    signals: Signals,
    room: Room,
    state: PlannerState,
    now: datetime,
) -> Plan:
    """The changes this round, those held back and why, and the next state."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime (the service's times are)")
    groups = sorted(groups, key=lambda g: g.name)
    held: list[Held] = []
    spells = unhealthy_spells(policy.recycle, groups, signals, state, now)
    observed = replace(_observe(policy.scale, groups, signals, state, now), unhealthy_since=spells)
    recycles = RecycleWishes([], [], [])
    if policy.recycle is not None:
        recycles = recycle_wishes(policy.recycle, groups, signals, spells, now, held)
    ups: list[_ScaleWish] = []
    downs: list[_ScaleWish] = []
    if policy.scale is not None:
        ups, downs = _scale_wishes(policy.scale, groups, signals, observed, now, held)
    floor = policy.recycle.healthy_floor if policy.recycle is not None else 0
    wishes: list[RecycleWish | _ScaleWish] = [
        *sorted(recycles.unhealthy, key=_key),
        *sorted(recycles.bans, key=_key),
        *sorted(ups, key=_key),
        *sorted(recycles.ages, key=_key),
        *sorted(downs, key=_key),
    ]
    changes = _select(
        wishes,
        policy.max_changes_per_round,
        floor,
        signals,
        room,
        held,
    )
    return Plan(tuple(changes), tuple(held), after(observed, changes, now), observed)


def _key(wish: RecycleWish | _ScaleWish) -> tuple[object, ...]:
    return wish.key


def _observe(
    scale: ScalePolicy | None,
    groups: Sequence[FleetGroup],
    signals: Signals,
    state: PlannerState,
    now: datetime,
) -> PlannerState:
    """This round's idleness recorded: a group is idle while no grant goes
    unmet and one of its proxies is free; its spell starts at the first idle
    round and ends at the first that is not (or that has no signal)."""
    if scale is None:
        return PlannerState()
    memory: dict[str, GroupMemory] = {}
    for group in groups:
        if group.name not in scale.groups:
            continue
        before = state.memory(group.name)
        signal = signals.groups.get(group.name)
        idle = signal is not None and signal.refused == 0 and signal.leased < group.replicas
        since = (before.idle_since or now) if idle else None
        memory[group.name] = GroupMemory(before.last_change_at, since)
    return PlannerState(memory)


def _scale_wishes(
    policy: ScalePolicy,
    groups: Sequence[FleetGroup],
    signals: Signals,
    observed: PlannerState,
    now: datetime,
    held: list[Held],
) -> tuple[list[_ScaleWish], list[_ScaleWish]]:
    ups: list[_ScaleWish] = []
    downs: list[_ScaleWish] = []
    for group in groups:
        bounds = policy.groups.get(group.name)
        if bounds is None:
            continue
        before = group.replicas
        if before < bounds.min:
            change = Scale(group.name, before, bounds.min, "min", f"below its min {bounds.min}")
            ups.append(_ScaleWish(group, bounds.min, change, (0, 0.0, group.name)))
            continue
        if before > bounds.max:
            change = Scale(group.name, before, bounds.max, "max", f"above its max {bounds.max}")
            downs.append(_ScaleWish(group, bounds.max, change, (0, group.name)))
            continue
        memory = observed.memory(group.name)
        settling = memory.last_change_at is not None and now - memory.last_change_at < policy.settle
        signal = signals.groups.get(group.name)
        per_minute = signals.unmet_per_minute(signal) if signal is not None else 0.0
        if signal is not None and per_minute >= policy.unmet_per_minute:
            rate = (
                f"{signal.refused} grants refused within {fmt(signals.window)}, "
                f"{round(per_minute, 2):g} a minute (unmetPerMinute {policy.unmet_per_minute:g})"
            )
            target = min(bounds.max, before + policy.step)
            if before >= bounds.max:
                held.append(Held(group.name, "demand", f"{rate}; but at its max {bounds.max}"))
            elif settling:
                held.append(
                    Held(group.name, "demand", f"{rate}; but {_settling(memory, policy, now)}")
                )
            else:
                change = Scale(group.name, before, target, "demand", rate)
                key = (1, -per_minute, group.name)
                ups.append(_ScaleWish(group, target, change, key))
            continue
        if memory.idle_since is None or now - memory.idle_since < policy.idle_after:
            continue
        leased = signal.leased if signal is not None else before
        target = max(bounds.min, leased, before - policy.step)
        if target >= before:
            continue
        idle = (
            f"idle for {fmt(now - memory.idle_since)} (idleAfter {fmt(policy.idle_after)}), "
            f"{leased} of {before} leased"
        )
        if settling:
            held.append(Held(group.name, "idle", f"{idle}; but {_settling(memory, policy, now)}"))
            continue
        change = Scale(group.name, before, target, "idle", idle)
        downs.append(_ScaleWish(group, target, change, (1, group.name)))
    return ups, downs


def _settling(memory: GroupMemory, policy: ScalePolicy, now: datetime) -> str:
    assert memory.last_change_at is not None
    return (
        f"settling: its last change was {fmt(now - memory.last_change_at)} ago "
        f"(settle {fmt(policy.settle)})"
    )


def _select(
    wishes: Sequence[RecycleWish | _ScaleWish],
    limit: int,
    floor: int,
    signals: Signals,
    room: Room,
    held: list[Held],
) -> list[Change]:
    """The wishes in order, each taken unless the round's limit, the group's
    healthy floor, a recycle in its group (for a scale-down) or the room of
    its place (for a scale-up) refuses it."""
    healthy = {
        wish.group.name: sum(
            1 for p in wish.group.proxies if (s := signals.proxies.get(p.name)) and s.healthy
        )
        for wish in wishes
    }
    recycled: set[str] = set()
    taken: dict[str, dict[str, int]] = {}
    chosen: list[Change] = []
    waiting: list[Held] = []  # past the round's limit
    floored: dict[str, list[Held]] = {}  # by group: held by its healthy floor
    for wish in wishes:
        change = wish.change
        subject = change.proxy if isinstance(change, Recycle) else change.group
        if len(chosen) >= limit:
            why = f"{limit} changes this round already (maxChangesPerRound {limit})"
            waiting.append(Held(subject, change.rule, f"{change.reason}; but {why}"))
            continue
        if isinstance(wish, RecycleWish):
            name = wish.group.name
            if wish.healthy and healthy[name] - 1 < floor:
                why = (
                    f"it would leave {healthy[name] - 1} healthy proxies in {name}, "
                    f"below healthyFloor {floor}"
                )
                line = Held(subject, change.rule, f"{change.reason}; but {why}")
                floored.setdefault(name, []).append(line)
                continue
            healthy[name] -= wish.healthy
            recycled.add(name)
            chosen.append(wish.change)
            continue
        scale = wish.change
        if scale.after < scale.before:
            if scale.group in recycled:
                why = "a proxy of the group is recycled this round"
                held.append(Held(subject, scale.rule, f"{scale.reason}; but {why}"))
                continue
            chosen.append(scale)
            continue
        group = wish.group
        place = group.place or ""
        fits = room.fits(group, taken.get(place, {}))
        after = wish.target if fits is None else min(wish.target, scale.before + fits)
        if after <= scale.before:
            why = f"no room on {group.place} for one more replica"
            held.append(Held(subject, scale.rule, f"{scale.reason}; but {why}"))
            continue
        if after < wish.target:
            # The rest of what was asked is held: the log says what the room refused.
            why = f"room for {after - scale.before} more on {group.place} only"
            left = wish.target - after
            held.append(Held(subject, scale.rule, f"{scale.reason}; {left} of them not now: {why}"))
            scale = replace(
                scale,
                after=after,
                reason=f"{scale.reason}; room for {after - scale.before} more on {group.place}",
            )
        used = taken.setdefault(place, {})
        for resource, need in group.needs.items():
            used[resource] = used.get(resource, 0) + need * (after - scale.before)
        chosen.append(scale)
    for name, lines in floored.items():
        held.extend(_bounded(lines, name, f"below healthyFloor {floor}, held"))
    held.extend(_bounded(waiting, STACK, f"for later rounds: maxChangesPerRound {limit}"))
    return chosen


def _bounded(lines: Sequence[Held], subject: str, why: str) -> list[Held]:
    """The first NAMED of LINES as they are, with their reasons, and the rest
    in one line for SUBJECT: after a wave of bans a thousand recycles may
    wait for the round's limit or a group's floor, and a line each per round
    would flood the log while they drain."""
    if len(lines) <= NAMED + 1:
        return list(lines)
    rest = lines[NAMED:]
    rules = ",".join(sorted({h.rule for h in rest}))
    names = some([h.subject for h in rest])
    return [*lines[:NAMED], Held(subject, rules, f"{len(rest)} more changes ({names}) {why}")]
