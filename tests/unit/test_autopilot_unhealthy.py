"""The planner's unhealthyFor rule (proxyinfra/autopilot/recycling.py): a
proxy the service judged unhealthy at every round for that long is replaced;
its spell is the planner's memory, handed from round to round, and the
clock is an argument."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from proxyinfra.autopilot.changes import Held, Plan, PlannerState, Recycle
from proxyinfra.autopilot.fleet import FleetGroup, Room
from proxyinfra.autopilot.plan import plan
from proxyinfra.autopilot.signals import ProxySignal, Signals
from tests.support.autopilot_plan import NOW, WINDOW, fine, group, policy

DOWN = ProxySignal(healthy=False, unhealthy=True)
UNKNOWN = ProxySignal(healthy=False)  # not probed yet: says nothing of the proxy
RULE = {"bannedSites": None, "unhealthyFor": "30m", "healthyFloor": 1}


def at(
    when: datetime,
    groups: list[FleetGroup],
    proxies: Mapping[str, ProxySignal],
    state: PlannerState,
    rule: Mapping[str, object] = RULE,
    k: int = 10,
) -> Plan:
    signals = Signals(when, WINDOW, fine(*groups) | dict(proxies))
    return plan(policy(rule, k=k), groups, signals, Room(), state, when)


def test_unhealthy_at_every_round_for_the_whole_spell_is_recycled_at_its_edge() -> None:
    home = group("home", 2)
    first = at(NOW, [home], {"home-0": DOWN}, PlannerState())
    assert first.changes == () and first.held == ()
    assert first.state.unhealthy_since == {"home-0": NOW}
    before = at(NOW + timedelta(minutes=29, seconds=59), [home], {"home-0": DOWN}, first.state)
    assert before.changes == ()
    assert before.state.unhealthy_since == {"home-0": NOW}
    edge = at(NOW + timedelta(minutes=30), [home], {"home-0": DOWN}, before.state)
    reason = "unhealthy for 30m (unhealthyFor 30m)"
    assert edge.changes == (Recycle("home", "home-0", "unhealthyFor", reason),)
    # A proxy down takes nothing from the healthy floor (1): home-1 still serves.
    assert edge.held == ()
    assert edge.state.unhealthy_since == {}  # replaced: its name leaves the fleet
    assert edge.observed.unhealthy_since == {"home-0": NOW}  # if the update fails


def test_a_round_that_sees_it_healthy_or_unknown_starts_the_spell_over() -> None:
    home = group("home", 2)
    state = at(NOW, [home], {"home-0": DOWN}, PlannerState()).state
    for seen in (ProxySignal(True), UNKNOWN):
        between = at(NOW + timedelta(minutes=10), [home], {"home-0": seen}, state)
        assert between.state.unhealthy_since == {}
        later = NOW + timedelta(minutes=31)
        again = at(later, [home], {"home-0": DOWN}, between.state)
        assert again.changes == ()
        assert again.state.unhealthy_since == {"home-0": later}


def test_with_no_proxy_of_the_stack_healthy_they_are_held_in_one_line() -> None:
    home = group("home", 7)
    down = {f"home-{i}": DOWN for i in range(7)}
    state = at(NOW, [home], down, PlannerState()).state
    result = at(NOW + timedelta(hours=1), [home], down, state)
    assert result.changes == ()
    assert result.held == (
        Held(
            "stack",
            "unhealthyFor",
            "7 proxies unhealthy for at least 30m (home-0, home-1, home-2, home-3, home-4 "
            "and 2 more); but no proxy of the stack is healthy: the service's probes may be "
            "failing, not every proxy at once",
        ),
    )
    # One healthy proxy is enough to act: the probes work.
    well = at(NOW + timedelta(hours=1), [home], down | {"home-6": ProxySignal(True)}, state)
    assert len([c for c in well.changes if isinstance(c, Recycle)]) == 6


def test_the_longest_down_first_before_bans_and_external_ones_held() -> None:
    groups = [group("a", 1), group("b", 1), group("c", 1), group("ext", 1, backend="external")]
    rule = {**RULE, "bannedSites": 3}
    state = PlannerState(
        unhealthy_since={"a-0": NOW - timedelta(hours=1), "b-0": NOW - timedelta(hours=2)}
        | {"ext-0": NOW - timedelta(hours=3)}
    )
    banned = ProxySignal(True, 3, NOW - timedelta(minutes=1))
    signals = {"a-0": DOWN, "b-0": DOWN, "c-0": banned, "ext-0": DOWN}
    result = at(NOW, groups, signals, state, rule, k=2)
    assert [(c.proxy, c.rule) for c in result.changes if isinstance(c, Recycle)] == [
        ("b-0", "unhealthyFor"),
        ("a-0", "unhealthyFor"),
    ]
    assert [(h.subject, h.rule) for h in result.held] == [
        ("ext-0", "unhealthyFor"),
        ("c-0", "bannedSites"),
    ]
    assert "external proxies are never recycled" in result.held[0].reason


def test_a_kubernetes_pod_down_is_left_to_kubernetes() -> None:
    pods = group("pods", 2, backend="kubernetes", provider="cluster")
    state = PlannerState(unhealthy_since={"pods-0": NOW - timedelta(hours=1)})
    result = at(NOW, [pods], {"pods-0": DOWN}, state)
    assert result.changes == ()
    assert result.held == (
        Held(
            "pods-0",
            "unhealthyFor",
            "unhealthy for 1h (unhealthyFor 30m); but kubernetes restarts a failing proxy pod "
            "itself (its liveness probe), and a new pod would keep its node's egress address",
        ),
    )
    # Where the cluster gives each pod its own egress address, a new pod is a new address.
    per_pod = at(NOW, [pods], {"pods-0": DOWN}, state, {**RULE, "egressPerPod": ["cluster"]})
    assert [(c.proxy, c.rule) for c in per_pod.changes if isinstance(c, Recycle)] == [
        ("pods-0", "unhealthyFor")
    ]


def test_without_the_key_nothing_is_remembered() -> None:
    home = group("home", 2)
    result = at(NOW, [home], {"home-0": DOWN}, PlannerState(), {"bannedSites": 3})
    assert result.state.unhealthy_since == {} and result.changes == ()
