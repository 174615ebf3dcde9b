"""The planner's recycle rules (proxyinfra/autopilot/plan.py runs them):
which proxies a rule wants replaced this round, and which it holds and why.

- **unhealthyFor**: a proxy the service judged unhealthy at every round for
  at least that long is replaced (a VM that died, a Spot VM preempted and
  deleted). Unless no proxy of the stack is healthy: then the fault is more
  likely the service's probes than every proxy at once, and replacing the
  fleet would cure nothing (held, in one line for the stack).
- **bannedSites**: a proxy the service counted blocked by at least N
  distinct sites within the window, unless its latest report predates its
  current generation (all were its old address's), or the generation is
  younger than the window (the count may still hold its old address's
  bans: held until the window starts at or after it was made).
- **maxAge**: a proxy whose generation is at least that old.
- Never ``external`` proxies (the project cannot renumber them); never
  kubernetes ones unless their provider is in ``egressPerPod`` (a new pod
  keeps the node's egress address; one down is Kubernetes' to restart).
  Both are held with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from proxyinfra.autopilot.changes import Held, PlannerState, Recycle, some
from proxyinfra.autopilot.fleet import EXTERNAL, KUBERNETES, FleetGroup, FleetProxy
from proxyinfra.autopilot.policy import RecyclePolicy
from proxyinfra.autopilot.policy import format_duration as fmt
from proxyinfra.autopilot.signals import ProxySignal, Signals


@dataclass(frozen=True)
class RecycleWish:
    group: FleetGroup
    healthy: bool
    change: Recycle
    key: tuple[object, ...]


@dataclass(frozen=True)
class RecycleWishes:
    """Each rule's wishes, in the order the round takes them."""

    unhealthy: list[RecycleWish]
    bans: list[RecycleWish]
    ages: list[RecycleWish]


def unhealthy_spells(
    policy: RecyclePolicy | None,
    groups: Sequence[FleetGroup],
    signals: Signals,
    state: PlannerState,
    now: datetime,
) -> dict[str, datetime]:
    """Per proxy the service judges unhealthy now, the first round of its
    spell: the one remembered, or this one. A proxy seen healthy, unknown or
    not at all in a round starts over (it leaves the map)."""
    if policy is None or policy.unhealthy_for is None:
        return {}
    spells: dict[str, datetime] = {}
    for group in groups:
        for proxy in group.proxies:
            signal = signals.proxies.get(proxy.name)
            if signal is not None and signal.unhealthy:
                spells[proxy.name] = state.unhealthy_since.get(proxy.name, now)
    return spells


def recycle_wishes(
    policy: RecyclePolicy,
    groups: Sequence[FleetGroup],
    signals: Signals,
    spells: Mapping[str, datetime],
    now: datetime,
    held: list[Held],
) -> RecycleWishes:
    if policy.banned_sites is not None and signals.window != policy.window:
        raise ValueError(
            f"signals counted over {fmt(signals.window)}, the policy's window is "
            f"{fmt(policy.window)}: ask the service with window={int(policy.window.total_seconds())}"
        )
    wishes = RecycleWishes([], [], [])
    any_healthy = any(signal.healthy for signal in signals.proxies.values())
    unserved: list[str] = []  # down long enough, held while no proxy is healthy
    # By group, rule and refusal: the proxies a backend cannot give a new address.
    refused: dict[tuple[str, str, str], list[Held]] = {}
    for group in groups:
        for proxy in sorted(group.proxies, key=lambda p: p.name):
            signal = signals.proxies.get(proxy.name)
            sites = _banned_sites(proxy, signal)
            since = spells.get(proxy.name)
            if (
                policy.unhealthy_for is not None
                and since is not None
                and now - since >= policy.unhealthy_for
            ):
                rule = "unhealthyFor"
                reason = (
                    f"unhealthy for {fmt(now - since)} (unhealthyFor {fmt(policy.unhealthy_for)})"
                )
                if not any_healthy:
                    unserved.append(proxy.name)
                    continue
            elif policy.banned_sites is not None and sites >= policy.banned_sites:
                rule = "bannedSites"
                reason = (
                    f"blocked by {sites} distinct sites within {fmt(policy.window)} "
                    f"(bannedSites {policy.banned_sites})"
                )
                if proxy.created_at is not None and proxy.created_at > signals.start:
                    young = (
                        f"but it was made {fmt(now - proxy.created_at)} ago, within the window, "
                        "whose count may still hold the bans of the address it replaced"
                    )
                    held.append(Held(proxy.name, rule, f"{reason}; {young}"))
                    continue
            elif (
                policy.max_age is not None
                and proxy.created_at is not None
                and now - proxy.created_at >= policy.max_age
            ):
                rule = "maxAge"
                reason = (
                    f"made {fmt(now - proxy.created_at)} ago, past maxAge {fmt(policy.max_age)}"
                )
            else:
                continue
            refusal = _not_recyclable(group, policy, rule)
            if refusal is not None:
                line = Held(proxy.name, rule, f"{reason}; but {refusal}")
                refused.setdefault((group.name, rule, refusal), []).append(line)
                continue
            change = Recycle(group.name, proxy.name, rule, reason)
            healthy = signal is not None and signal.healthy
            last = (*_age_key(proxy), group.name, proxy.name)
            if rule == "unhealthyFor":
                assert since is not None
                wishes.unhealthy.append(RecycleWish(group, healthy, change, (since, *last)))
            elif rule == "bannedSites":
                wishes.bans.append(RecycleWish(group, healthy, change, (-sites, *last)))
            else:
                wishes.ages.append(RecycleWish(group, healthy, change, last))
    for (name, rule, refusal), lines in refused.items():
        # One line for a group: past maxAge every pod of a kubernetes group
        # stays refused, round after round, for as long as the group lives.
        if len(lines) == 1:
            held.extend(lines)
            continue
        subjects = [line.subject for line in lines]
        reason = f"{len(lines)} of its proxies ({some(subjects)}) by {rule}; but {refusal}"
        held.append(Held(name, rule, reason))
    if unserved:
        # One line for them all: a service that lost its network judges every
        # proxy down, and a line per proxy per round would flood the log.
        assert policy.unhealthy_for is not None
        held.append(Held(STACK, "unhealthyFor", _unserved(unserved, policy.unhealthy_for)))
    return wishes


STACK = "stack"  # a held line's subject when it is about the whole stack


def _unserved(names: Sequence[str], unhealthy_for: timedelta) -> str:
    return (
        f"{len(names)} proxies unhealthy for at least {fmt(unhealthy_for)} ({some(names)}); but no "
        "proxy of the stack is healthy: the service's probes may be failing, not every "
        "proxy at once"
    )


def _age_key(proxy: FleetProxy) -> tuple[bool, datetime | float]:
    # Oldest first; a proxy of unknown age after every known one.
    return (proxy.created_at is None, proxy.created_at or 0.0)


def _banned_sites(proxy: FleetProxy, signal: ProxySignal | None) -> int:
    """The service's count of distinct sites within the window; 0 when its
    latest report predates the proxy's current generation (all were of the
    address a recycle replaced)."""
    if signal is None or signal.last_blocked_at is None:
        return 0
    if proxy.created_at is not None and signal.last_blocked_at <= proxy.created_at:
        return 0
    return signal.blocked_sites


def _not_recyclable(group: FleetGroup, policy: RecyclePolicy, rule: str) -> str | None:
    if group.backend == EXTERNAL:
        return (
            "external proxies are never recycled: the project did not make them and "
            "cannot give them a new address (take it out of rotation instead)"
        )
    if group.backend == KUBERNETES and group.provider not in policy.egress_per_pod:
        if rule == "unhealthyFor":
            return (
                "kubernetes restarts a failing proxy pod itself (its liveness probe), and a "
                "new pod would keep its node's egress address"
            )
        return (
            "a new kubernetes pod keeps its node's egress address, so a recycle gives "
            f"no new one; list provider {group.provider!r} in autopilot.recycle.egressPerPod "
            "only if this cluster gives each pod its own egress address"
        )
    return None
