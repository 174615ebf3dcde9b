"""The autopilot's planner, rule by rule (docs/autopilot.md, "The planner's
rules"): pure, its clock an argument, its memory an input and an output."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import datetime, timedelta

import pytest

from proxyinfra.autopilot.changes import Held, Plan, PlannerState, Recycle, Scale, one_line
from proxyinfra.autopilot.fleet import FleetGroup, FleetProxy, Room
from proxyinfra.autopilot.plan import plan
from proxyinfra.autopilot.policy import AutopilotPolicy
from proxyinfra.autopilot.signals import GroupSignal, ProxySignal, Signals
from tests.support.autopilot_plan import GIB, MIN, NOW, WINDOW, fine, group, policy


def banned(sites: int = 3, *, at: datetime = NOW - MIN, healthy: bool = True) -> ProxySignal:
    return ProxySignal(healthy, sites, at)


def run(
    pol: AutopilotPolicy,
    groups: list[FleetGroup],
    proxies: Mapping[str, ProxySignal] | None = None,
    demand: Mapping[str, GroupSignal] | None = None,
    room: Room | None = None,
    state: PlannerState | None = None,
    now: datetime = NOW,
) -> Plan:
    """One round; the service counted over the policy's 10 minutes ending NOW."""
    signals = Signals(NOW, WINDOW, fine(*groups) | dict(proxies or {}), dict(demand or {}))
    return plan(pol, groups, signals, room or Room(), state or PlannerState(), now)


# --- recycling by bans --------------------------------------------------------


def test_three_distinct_sites_recycle_two_do_not() -> None:
    home = group()
    result = run(policy({}), [home], {"home-0": banned(3), "home-1": banned(2)})
    reason = "blocked by 3 distinct sites within 10m (bannedSites 3)"
    assert result.changes == (Recycle("home", "home-0", "bannedSites", reason),)
    assert result.held == ()
    assert result.changes[0].message == f"autopilot: recycle home-0 (home): {reason}"


def test_a_generation_younger_than_the_window_waits_until_the_window_starts_after_it() -> None:
    # The service's count covers NOW-10m..NOW; a proxy made inside it may be
    # counted with the bans of the address it replaced.
    edge = NOW - WINDOW
    at_edge = group("a", 1, made=edge)
    inside = group("b", 1, made=edge + timedelta(seconds=1))
    result = run(policy({}), [at_edge, inside], {"a-0": banned(), "b-0": banned()})
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["a-0"]
    assert result.held == (
        Held(
            "b-0",
            "bannedSites",
            "blocked by 3 distinct sites within 10m (bannedSites 3); but it was made 9m59s "
            "ago, within the window, whose count may still hold the bans of the address it "
            "replaced",
        ),
    )


def test_reports_from_before_the_generation_count_not_so_no_recycle_loop() -> None:
    made = NOW - 2 * MIN  # recycled two minutes ago; its old address's last ban at that time
    home = group(made=made)
    assert run(policy({}), [home], {"home-0": banned(at=made)}) == run(policy({}), [home])
    assert run(policy({}), [home], {"home-0": banned(at=made)}).held == ()


def test_signals_over_another_window_are_refused() -> None:
    home = group()
    signals = Signals(NOW, timedelta(minutes=5), fine(home))
    with pytest.raises(ValueError, match="ask the service with window=600"):
        plan(policy({}), [home], signals, Room(), PlannerState(), NOW)


def test_a_message_is_one_bounded_line() -> None:
    line = one_line("a\nforged: yes\u202e" + "x" * 400)
    assert line.startswith("a?forged: yes?x") and len(line) == 300 and line.endswith("...")


# --- recycling by age ---------------------------------------------------------


def test_max_age_recycles_at_its_edge_not_before() -> None:
    old = group("home", 1, made=NOW - timedelta(days=1))
    young = group("eu", 1, made=NOW - timedelta(days=1) + timedelta(seconds=1))
    result = run(policy({"bannedSites": None, "maxAge": "1d"}), [old, young])
    assert result.changes == (Recycle("home", "home-0", "maxAge", "made 1d ago, past maxAge 1d"),)


def test_bans_come_before_age_and_the_oldest_first() -> None:
    groups = [
        group(n, 1, made=NOW - timedelta(days=d))
        for n, d in (("a", 3), ("b", 5), ("c", 4), ("d", 2))
    ]
    result = run(policy({"maxAge": "1d"}, k=3), groups, {"d-0": banned()})
    assert [(c.proxy, c.rule) for c in result.changes if isinstance(c, Recycle)] == [
        ("d-0", "bannedSites"),
        ("b-0", "maxAge"),
        ("c-0", "maxAge"),
    ]
    assert [h.subject for h in result.held] == ["a-0"]


# --- at most K changes a round ------------------------------------------------


def test_at_most_k_changes_the_most_banned_first() -> None:
    groups = [group(n, 1) for n in ("a", "b", "c", "d")]
    signals = {
        "a-0": banned(),
        "b-0": banned(5),
        "c-0": banned(4),
        "d-0": banned(),
    }
    result = run(policy({}, k=2), groups, signals)
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["b-0", "c-0"]
    assert [h.subject for h in result.held] == ["a-0", "d-0"]
    assert all(
        h.reason.endswith("but 2 changes this round already (maxChangesPerRound 2)")
        for h in result.held
    )


def test_past_k_the_next_five_wait_in_a_line_each_and_the_rest_in_one() -> None:
    # A wave of bans: 13 proxies, most sites first (n-0 has 15 - n sites).
    groups = [group(f"g{n:02}", 1) for n in range(13)]
    signals = {f"g{n:02}-0": banned(15 - n) for n in range(13)}
    result = run(policy({}, k=2), groups, signals)
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["g00-0", "g01-0"]
    *own, rest = result.held
    assert [h.subject for h in own] == [f"g{n:02}-0" for n in range(2, 7)]
    assert all(h.reason.endswith("(maxChangesPerRound 2)") for h in own)
    assert (rest.subject, rest.rule) == ("stack", "bannedSites")
    assert rest.reason == (
        "6 more changes (g07-0, g08-0, g09-0, g10-0, g11-0 and 1 more) for later rounds: "
        "maxChangesPerRound 2"
    )
    # Six waiting get six lines of their own: one line standing for one is no shorter.
    result = run(policy({}, k=2), groups[:8], signals)
    assert [h.subject for h in result.held] == [f"g{n:02}-0" for n in range(2, 8)]


def test_k_counts_scale_changes_too() -> None:
    pol = policy({}, {"groups": {"home": {"min": 1, "max": 4}, "eu": {"min": 1, "max": 4}}}, k=2)
    groups = [group("home"), group("eu")]
    busy = {"home": GroupSignal(50, 2), "eu": GroupSignal(30, 2)}
    result = run(pol, groups, {"home-0": banned()}, busy)
    assert [
        type(c).__name__ + ":" + (c.proxy if isinstance(c, Recycle) else c.group)
        for c in result.changes
    ] == ["Recycle:home-0", "Scale:home"]
    assert [h.subject for h in result.held] == ["eu"]


# --- the healthy floor --------------------------------------------------------


def test_no_recycle_below_the_healthy_floor_most_banned_then_oldest_first() -> None:
    home = FleetGroup(
        "home",
        "kvm-home",
        "kvm",
        4,
        (
            FleetProxy("home-0", NOW - timedelta(hours=1)),
            FleetProxy("home-1", NOW - timedelta(hours=3)),
            FleetProxy("home-2", NOW - timedelta(hours=2)),
            FleetProxy("home-3", NOW - timedelta(hours=9)),
        ),
    )
    signals = {
        "home-0": banned(4),
        "home-1": banned(),
        "home-2": banned(),
        "home-3": banned(),
    }
    result = run(policy({"healthyFloor": 2}), [home], signals)
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["home-0", "home-3"]
    assert [h.subject for h in result.held] == ["home-1", "home-2"]
    assert result.held[0].reason.endswith(
        "but it would leave 1 healthy proxies in home, below healthyFloor 2"
    )


def test_past_the_floor_the_next_five_are_held_in_a_line_each_and_the_rest_in_one() -> None:
    # A wave of bans on a group at its floor: 10 healthy, floor 9, all banned.
    home = group(replicas=10)
    signals = {f"home-{i}": banned(13 - i) for i in range(10)}
    result = run(policy({"healthyFloor": 9}, k=100), [home], signals)
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["home-0"]
    *own, rest = result.held
    assert [h.subject for h in own] == [f"home-{i}" for i in range(1, 6)]
    assert all(h.reason.endswith("below healthyFloor 9") for h in own)
    assert (rest.subject, rest.rule) == ("home", "bannedSites")
    assert rest.reason == (
        "4 more changes (home-6, home-7, home-8, home-9) below healthyFloor 9, held"
    )


def test_unhealthy_proxies_are_recycled_without_touching_the_floor() -> None:
    # home-2 is a replacement still booting (or a proxy killed meanwhile): it
    # counts as not healthy, so home-1 is the one healthy proxy the floor keeps.
    home = group(replicas=3)
    signals = {
        "home-0": banned(healthy=False),
        "home-1": banned(),
        "home-2": ProxySignal(False),
    }
    result = run(policy({"healthyFloor": 0}), [home], signals)
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["home-0", "home-1"]
    result = run(policy({"healthyFloor": 1}), [home], signals)
    assert [c.proxy for c in result.changes if isinstance(c, Recycle)] == ["home-0"]
    assert [h.subject for h in result.held] == ["home-1"]


def test_a_proxy_discovery_does_not_know_counts_as_unhealthy() -> None:
    home = group(replicas=2)
    signals = Signals(NOW, WINDOW, {"home-0": banned()})  # home-1 unknown to the service
    result = plan(policy({"healthyFloor": 1}), [home], signals, Room(), PlannerState(), NOW)
    assert result.changes == () and [h.subject for h in result.held] == ["home-0"]


# --- backends that cannot give a new address ----------------------------------


def test_external_proxies_are_never_recycled() -> None:
    corp = FleetGroup("corp-1", "corp", "external", 1, (FleetProxy("corp-1", None),))
    result = run(policy({"maxAge": "1h"}), [corp], {"corp-1": banned()})
    assert result.changes == ()
    assert result.held == (
        Held(
            "corp-1",
            "bannedSites",
            (
                "blocked by 3 distinct sites within 10m (bannedSites 3); but external proxies "
                "are never recycled: the project did not make them and cannot give them a new "
                "address (take it out of rotation instead)"
            ),
        ),
    )


def test_kubernetes_proxies_are_refused_unless_the_cluster_egresses_per_pod() -> None:
    pods = group("pods", 1, backend="kubernetes", provider="cluster")
    signals = {"pods-0": banned()}
    refused = run(policy({}), [pods], signals)
    assert refused.changes == ()
    assert refused.held[0].reason.endswith(
        "but a new kubernetes pod keeps its node's egress address, so a recycle gives no new "
        "one; list provider 'cluster' in autopilot.recycle.egressPerPod only if this cluster "
        "gives each pod its own egress address"
    )
    allowed = run(policy({"egressPerPod": ["cluster"]}), [pods], signals)
    assert [c.proxy for c in allowed.changes if isinstance(c, Recycle)] == ["pods-0"]


def test_a_group_s_refused_proxies_are_one_held_line() -> None:
    # Past maxAge every pod stays refused, round after round: one line, not one a pod.
    pods = group("pods", 7, backend="kubernetes", provider="cluster", made=NOW - timedelta(days=8))
    result = run(policy({"maxAge": "7d"}), [pods], fine(pods))
    assert result.changes == ()
    [line] = result.held
    assert (line.subject, line.rule) == ("pods", "maxAge")
    assert line.reason.startswith(
        "7 of its proxies (pods-0, pods-1, pods-2, pods-3, pods-4 and 2 more) by maxAge; "
        "but a new kubernetes pod keeps its node's egress address"
    )


# --- scaling ------------------------------------------------------------------

SCALE = {"groups": {"home": {"min": 2, "max": 4}}, "settle": "5m", "idleAfter": "15m"}


def test_demand_scales_up_by_step_within_max() -> None:
    result = run(policy(scale=SCALE), [group(replicas=2)], demand={"home": GroupSignal(25, 2)})
    assert result.changes == (
        Scale(
            "home", 2, 3, "demand", "25 grants refused within 10m, 2.5 a minute (unmetPerMinute 1)"
        ),
    )
    assert result.changes[0].message == (
        "autopilot: scale home from 2 to 3: 25 grants refused within 10m, 2.5 a minute "
        "(unmetPerMinute 1)"
    )
    result = run(
        policy(scale=SCALE | {"step": 5}), [group(replicas=3)], demand={"home": GroupSignal(25, 3)}
    )
    assert [(c.before, c.after) for c in result.changes if isinstance(c, Scale)] == [(3, 4)]
    at_max = run(policy(scale=SCALE), [group(replicas=4)], demand={"home": GroupSignal(90, 4)})
    assert at_max.changes == ()
    assert at_max.held[0].reason.endswith("but at its max 4")


def test_below_the_threshold_nothing_moves() -> None:
    result = run(policy(scale=SCALE), [group(replicas=3)], demand={"home": GroupSignal(9, 3)})
    assert result.changes == () and result.held == ()


def test_scale_up_never_past_the_room_of_its_place() -> None:
    needs = {"memory": GIB, "disk": 10 * GIB}
    pol = policy(
        scale={"groups": {"a": {"min": 1, "max": 9}, "b": {"min": 1, "max": 9}}, "step": 4}
    )
    a = group("a", 1, place="kvm-home/nas1", needs=needs)
    b = group("b", 1, place="kvm-home/nas1", needs=needs)
    busy = {"a": GroupSignal(90, 1), "b": GroupSignal(20, 1)}
    # memory for 3, disk for 2 more: a takes both, b finds none left
    room = Room({"kvm-home/nas1": {"memory": 3 * GIB + 1, "disk": 25 * GIB}})
    result = run(pol, [a, b], demand=busy, room=room)
    assert result.changes == (
        Scale(
            "a",
            1,
            3,
            "demand",
            (
                "90 grants refused within 10m, 9 a minute (unmetPerMinute 1); room for 2 more on "
                "kvm-home/nas1"
            ),
        ),
    )
    # a asked for 4 more: the 2 the room refuses are held, with the room named
    assert [h.subject for h in result.held] == ["a", "b"]
    assert result.held[0].reason.endswith(
        "2 of them not now: room for 2 more on kvm-home/nas1 only"
    )
    assert result.held[1].reason.endswith("but no room on kvm-home/nas1 for one more replica")


def test_unknown_room_is_no_room_and_no_place_is_no_limit() -> None:
    pol = policy(scale={"groups": {"home": {"min": 1, "max": 9}}, "step": 3})
    busy = {"home": GroupSignal(50, 1)}
    unknown = run(
        pol, [group(replicas=1, place="kvm-home/nas9", needs={"memory": GIB})], demand=busy
    )
    assert unknown.changes == () and "no room on kvm-home/nas9" in unknown.held[0].reason
    unlimited = run(pol, [group(replicas=1, backend="gcp")], demand=busy)
    assert [(c.before, c.after) for c in unlimited.changes if isinstance(c, Scale)] == [(1, 4)]


def test_bounds_are_restored_without_a_signal() -> None:
    pol = policy(scale={"groups": {"home": {"min": 2, "max": 4}, "eu": {"min": 2, "max": 4}}})
    result = run(pol, [group("home", 1), group("eu", 6)])
    assert result.changes == (
        Scale("home", 1, 2, "min", "below its min 2"),
        Scale("eu", 6, 4, "max", "above its max 4"),
    )


def test_down_only_after_the_idle_time_and_never_below_leased_or_min() -> None:
    pol = policy(scale=SCALE)
    home = group(replicas=4)
    idle = {"home": GroupSignal(0, 1)}
    first = run(pol, [home], demand=idle)
    assert first.changes == ()
    assert first.state.memory("home").idle_since == NOW
    almost = run(pol, [home], demand=idle, state=first.state, now=NOW + 14 * MIN)
    assert almost.changes == ()
    due = run(pol, [home], demand=idle, state=almost.state, now=NOW + 15 * MIN)
    assert due.changes == (
        Scale("home", 4, 3, "idle", "idle for 15m (idleAfter 15m), 1 of 4 leased"),
    )
    # every proxy leased: the group is not idle (a free proxy is what idle means)...
    leased = run(
        pol,
        [group(replicas=4)],
        demand={"home": GroupSignal(0, 4)},
        state=almost.state,
        now=NOW + 15 * MIN,
    )
    assert leased.changes == () and leased.state.memory("home").idle_since is None
    # ...and at its min nothing goes
    at_min = run(
        pol,
        [group(replicas=2)],
        demand={"home": GroupSignal(0, 0)},
        state=almost.state,
        now=NOW + 15 * MIN,
    )
    assert at_min.changes == ()


def test_demand_ends_an_idle_spell() -> None:
    pol = policy(scale=SCALE)
    home = group(replicas=3)
    first = run(pol, [home], demand={"home": GroupSignal(0, 0)})
    busy = run(
        pol, [home], demand={"home": GroupSignal(5, 3)}, state=first.state, now=NOW + 10 * MIN
    )
    assert busy.state.memory("home").idle_since is None
    again = run(
        pol, [home], demand={"home": GroupSignal(0, 0)}, state=busy.state, now=NOW + 16 * MIN
    )
    assert again.changes == () and again.state.memory("home").idle_since == NOW + 16 * MIN


def test_no_scale_down_in_a_round_that_recycles_in_the_group() -> None:
    pol = policy({}, {"groups": {"home": {"min": 2, "max": 4}}})
    home = group(replicas=5)
    result = run(pol, [home], {"home-4": banned()})
    assert [type(c).__name__ for c in result.changes] == ["Recycle"]
    assert (
        result.held[0].reason == "above its max 4; but a proxy of the group is recycled this round"
    )


def test_settle_holds_a_group_after_its_change_in_either_direction() -> None:
    pol = policy(scale=SCALE)
    up = run(pol, [group(replicas=2)], demand={"home": GroupSignal(30, 2)})
    assert up.state.memory("home").last_change_at == NOW
    assert up.observed.memory("home").last_change_at is None  # for an update that failed
    held = run(
        pol,
        [group(replicas=3)],
        demand={"home": GroupSignal(30, 3)},
        state=up.state,
        now=NOW + 4 * MIN,
    )
    assert held.changes == ()
    assert held.held[0].reason.endswith("but settling: its last change was 4m ago (settle 5m)")
    later = run(
        pol,
        [group(replicas=3)],
        demand={"home": GroupSignal(30, 3)},
        state=held.state,
        now=NOW + 5 * MIN,
    )
    assert [(c.before, c.after) for c in later.changes if isinstance(c, Scale)] == [(3, 4)]


def test_no_flapping_across_rounds() -> None:
    """A signal that swings every minute between demand and idleness moves the
    group at most once per settle time, and never down within idleAfter of
    demand."""
    pol = policy(
        scale={"groups": {"home": {"min": 1, "max": 6}}, "settle": "5m", "idleAfter": "10m"}
    )
    replicas, state = 3, PlannerState()
    moves: list[tuple[datetime, int]] = []
    last_demand = NOW
    for minute in range(120):
        now = NOW + minute * MIN
        # busy in the first ten minutes of every half hour, idle otherwise
        busy = minute % 30 < 10
        signal = GroupSignal(40, replicas) if busy else GroupSignal(0, 0)
        last_demand = now if busy else last_demand
        result = run(pol, [group(replicas=replicas)], demand={"home": signal}, state=state, now=now)
        for change in result.changes:
            assert isinstance(change, Scale)
            if change.after < change.before:
                assert now - last_demand >= timedelta(minutes=10)
            moves.append((now, change.after - change.before))
            replicas = change.after
        state = result.state
    assert moves, "the group never moved"
    for (t1, _), (t2, _) in itertools.pairwise(moves):
        assert t2 - t1 >= timedelta(minutes=5)
    assert 1 <= replicas <= 6


# --- purity -------------------------------------------------------------------


def test_the_same_inputs_in_any_order_give_the_same_plan() -> None:
    pol = policy({"maxAge": "30m"}, {"groups": {"home": {"min": 1, "max": 4}}}, k=3)
    groups = [group("home", 3), group("eu", 2), group("zz", 1)]
    signals = {"eu-1": banned(), "zz-0": banned()}
    demand = {"home": GroupSignal(20, 3)}
    first = run(pol, groups, signals, demand)
    second = run(pol, list(reversed(groups)), signals, demand)
    assert first == second
    assert [getattr(c, "proxy", None) or c.group for c in first.changes] == ["eu-1", "zz-0", "home"]
    assert [h.subject for h in first.held] == ["eu-0", "home-0", "home-1", "home-2"]


def test_now_must_carry_its_zone() -> None:
    with pytest.raises(ValueError, match="aware datetime"):
        run(policy({}), [group()], now=datetime(2026, 12, 4, 12, 0))
