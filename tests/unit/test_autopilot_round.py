"""The autopilot's round (proxyinfra/autopilot/run.py) on a fake stack, a fake
clock and fake signals: what it changes, in what order, with which message
and targets, and the safety rules (the lock waited for, a failed update
undone, backed off and capped, dry run and pause changing nothing, a bad
policy refused before any update)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from proxyinfra.autopilot.changes import PlannerState
from proxyinfra.autopilot.memory import Memory
from proxyinfra.autopilot.status import serve
from proxyinfra.validation import ConfigError
from tests.support.autopilot_round import (
    RECYCLE,
    SCALE,
    T0,
    World,
    answer,
    urn,
)
from tests.support.stack_config import gcp_provider, placement, proxy


def test_a_proxy_blocked_by_three_sites_is_recycled_by_one_targeted_update(tmp_path: Path) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    assert world.pilot().round() == "planned"
    assert world.stack.config["generations"] == {"home-0": 2}
    [(message, targets)] = world.stack.updates
    assert message.startswith("autopilot: recycle home-0 (home): blocked by 3 distinct sites")
    assert targets == (urn("home-0"), urn("home-0-g2"))
    assert world.names() == ["home-0-g2", "home-1"]
    assert world.signals.windows == [600]
    [line] = world.lines("change")
    assert line["result"] == "applied" and line["update"] == 11
    assert line["kind"] == "recycle" and line["rule"] == "bannedSites"
    assert world.stack.refreshes == []  # what is banned is there: nothing to refresh
    assert line["proxies"] == ["home-0", "home-0-g2"]
    assert line["signal"]["blockedSites"] == 3 and line["signal"]["healthy"] is True
    assert line["message"] == message and line["duration"] == 0
    assert world.files.path.exists()


def test_a_change_is_logged_and_shown_while_its_update_runs(tmp_path: Path) -> None:
    """An update takes minutes on real hosts: before it ends, an `applying`
    line and the status page say which change runs, since when."""
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    seen: list[tuple[list[dict[str, object]], object]] = []
    world.stack.during = lambda: seen.append((world.lines(), world.status.document()["applying"]))
    assert world.pilot().round() == "planned"
    [(lines, applying)] = seen
    assert {k: v for k, v in lines[-1].items() if k not in ("ts", "stack")} == {
        "event": "applying",
        "kind": "recycle",
        "rule": "bannedSites",
        "group": "home",
        "proxies": ["home-0", "home-0-g2"],
        "message": world.stack.updates[0][0],
    }
    assert applying == {
        "message": world.stack.updates[0][0],
        "since": world.clock.now().isoformat(),
    }
    assert world.status.document()["applying"] is None  # the update ended
    assert [line["event"] for line in world.lines()][-2:] == ["change", "round"]


def test_a_proxy_down_through_rounds_of_separate_processes_is_recycled(tmp_path: Path) -> None:
    """The spell outlives the process (`--once` from cron): the first round
    writes when it began to the state file, a later process reads it."""
    world = World(tmp_path, {"recycle": {"unhealthyFor": "30m", "healthyFloor": 1}}, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    began = world.clock.now()
    down = {"home-0": "unhealthy"}
    world.signals.answer = answer(world.clock, world.names(), health=down)
    assert world.pilot().round() == "planned"
    assert world.stack.updates == []
    saved = json.loads(world.files.path.read_text())
    assert saved["unhealthySince"] == {"home-0": began.isoformat()}
    world.clock.advance(timedelta(minutes=30))
    world.signals.answer = answer(world.clock, world.names(), health=down)
    assert world.pilot().round() == "planned"  # a new Autopilot: what a new process has
    [(message, targets)] = world.stack.updates
    assert message == "autopilot: recycle home-0 (home): unhealthy for 30m (unhealthyFor 30m)"
    assert targets == (urn("home-0"), urn("home-0-g2"))
    # Refreshed first: what died may be gone, and some providers fail to delete what is.
    assert world.stack.refreshes == [(urn("home-0"),)]
    [line] = world.lines("change")
    assert line["rule"] == "unhealthyFor" and line["signal"]["unhealthy"] is True
    # The replaced proxy's spell is over: its name left the fleet.
    assert json.loads(world.files.path.read_text())["unhealthySince"] == {}


def test_a_failed_refresh_fails_the_change_before_any_edit(tmp_path: Path) -> None:
    world = World(tmp_path, {"recycle": {"unhealthyFor": "30m", "healthyFloor": 1}}, {"home": 2})
    world.files.save(Memory(PlannerState(unhealthy_since={"home-0": T0})))
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), health={"home-0": "unhealthy"})
    world.stack.refresh_failing = 1
    assert world.pilot().round() == "planned"
    assert world.stack.edits == [] and world.stack.updates == []
    [line] = world.lines("change")
    assert line["result"] == "failed"
    assert line["error"] == "its refresh: error: the host did not answer"


def test_only_an_update_creating_kvm_proxies_alone_skips_the_checkpoints(tmp_path: Path) -> None:
    """kvm creates take over what a killed run left (fixed names), so its
    updates may write the state once, at the end; a gcp instance lost from
    the state would be an orphan, so its updates keep a checkpoint per step."""
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.stack.config["providers"].append(gcp_provider())
    where = placement("e2-small", "debian", zone="europe-west1-b")
    world.stack.config["proxies"].append(proxy("eu", "gcp-eu", replicas=2, where=where))
    world.stack.deploy()  # the stack as `pulumi up` left it: eu-0 and eu-1 made
    world.clock.advance(timedelta(hours=1))
    blocked = {"home-0": 3, "eu-1": 3}
    world.signals.answer = answer(world.clock, world.names(), blocked=blocked)
    world.pilot().round()
    checkpoints = {
        targets[0]: c
        for (_, targets), c in zip(world.stack.updates, world.stack.checkpoints, strict=True)
    }
    assert checkpoints == {urn("home-0"): False, urn("eu-1"): True}


def test_demand_scales_up_once_per_round_within_max_and_settles(tmp_path: Path) -> None:
    world = World(tmp_path, SCALE, {"home": 2, "edge": 2})
    world.stack.config["autopilot"]["scale"]["groups"]["edge"] = {"min": 2, "max": 3}
    pilot = world.pilot()
    for _ in range(6):
        world.signals.answer = answer(world.clock, world.names(), refused={"home": 100, "edge": 50})
        pilot.round()
        world.clock.advance(timedelta(minutes=16))
    replicas = {e["name"]: e.get("replicas") for e in world.stack.config["proxies"]}
    assert replicas == {"home": 4, "edge": 3}  # each at its max, never past it
    messages = [m for m, _ in world.stack.updates]
    # maxChangesPerRound 1: one update a round, the highest demand first.
    assert len(messages) == 3
    assert messages[0].startswith("autopilot: scale home from 2 to 3: 100 grants refused")
    assert world.stack.updates[0][1] == (urn("home-2"),)
    assert messages[1].startswith("autopilot: scale home from 3 to 4")
    assert messages[2].startswith("autopilot: scale edge from 2 to 3")
    assert any("maxChangesPerRound 1" in line["message"] for line in world.lines("held"))
    held = [line["message"] for line in world.lines("held")]
    assert any("but at its max 4" in m for m in held)


def test_a_scale_change_settles_before_the_next(tmp_path: Path) -> None:
    world = World(tmp_path, SCALE, {"home": 2})
    pilot = world.pilot()
    world.signals.answer = answer(world.clock, world.names(), refused={"home": 100})
    pilot.round()
    world.clock.advance(timedelta(minutes=5))
    world.signals.answer = answer(world.clock, world.names(), refused={"home": 100})
    pilot.round()  # a new process would read the same state file
    assert len(world.stack.updates) == 1
    assert any("settling" in line["message"] for line in world.lines("held"))
    saved = json.loads(world.files.path.read_text())
    assert saved["groups"]["home"]["lastChangeAt"] == T0.isoformat()


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    world = World(tmp_path, {**RECYCLE, **SCALE}, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(
        world.clock, world.names(), blocked={"home-1": 4}, refused={"home": 100}
    )
    assert world.pilot(dry_run=True).round() == "dry-run"
    assert world.stack.updates == [] and world.stack.edits == []
    assert not world.files.path.exists()
    [line] = world.lines("change")
    assert line["result"] == "dry-run" and line["path"] == "generations.home-1"


def test_paused_changes_nothing_and_says_so_each_round(tmp_path: Path) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.files.path.parent.mkdir(parents=True)
    world.files.path.write_text("kept as it is\n")
    world.files.pause(T0, "ops@laptop")
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    pilot = world.pilot()
    assert [pilot.round(), pilot.round()] == ["paused", "paused"]
    assert world.stack.reads == 0 and world.stack.updates == [] and world.stack.edits == []
    assert world.files.path.read_text() == "kept as it is\n"
    assert [line["result"] for line in world.lines("round")] == ["paused", "paused"]
    assert b"egress_autopilot_paused 1.0" in world.status.metrics()
    assert world.files.resume()
    world.files.path.unlink()
    assert pilot.round() == "planned" and len(world.stack.updates) == 1


def test_another_operations_lock_is_waited_for_and_logged_then_the_change_goes_on(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    world.stack.locked_polls = 3
    world.stack.busy_updates = 1  # and taken again between the look and the update
    world.pilot().round()
    assert world.clock.slept == [2.0, 4.0, 8.0, 16.0]
    waits = world.lines("wait")
    assert len(waits) == 1  # one line per holder, not per poll
    assert waits[0]["holder"].startswith("ops@laptop (pid 4242)")
    # The edit was undone while the other held the lock, then made again.
    assert world.stack.edits == [
        ("generations.home-0", 2),
        ("generations.home-0", None),
        ("generations.home-0", 2),
    ]
    assert len(world.stack.updates) == 1
    [line] = world.lines("change")
    assert line["result"] == "applied" and line["duration"] == 30.0


def test_a_lock_held_past_the_timeout_leaves_the_config_as_it_was(tmp_path: Path) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    world.stack.locked_polls = 10_000
    pilot = world.pilot(lock_timeout=120)
    pilot.round()
    assert world.stack.edits == [] and world.stack.updates == []
    [line] = world.lines("change")
    assert line["result"] == "lock-timeout"
    # One line for the operator's terminal: the change and why it did not happen.
    assert pilot.failed == [f"{line['message']}: lock-timeout: {line['error']}"]
    assert sum(world.clock.slept) >= 120


def test_a_failed_update_is_undone_backed_off_and_capped_per_hour(tmp_path: Path) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.stack.failing = 100
    pilot = world.pilot(retry_cap=3, backoff=timedelta(minutes=1))
    results, failed = [], []
    for _ in range(12):
        world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
        pilot.round()
        results.append(world.lines("change")[-1]["result"])
        failed.append(len(pilot.failed))
        world.clock.advance(timedelta(seconds=50))
    assert "generations" not in world.stack.config or world.stack.config["generations"] == {}
    # Failed at 0 s; backoff 1 min, then 2 min; after 3 failures held for the hour.
    assert results[:7] == ["failed", "backoff", "failed", "backoff", "backoff", "failed", "capped"]
    assert set(results[7:]) == {"capped"}
    assert len([r for r in results if r == "failed"]) == 3
    assert failed == [1 if r == "failed" else 0 for r in results]  # backoff, capped: none
    assert b"egress_autopilot_update_failures_total 3.0" in world.status.metrics()
    assert world.status.document()["capped"] == ["recycle home-0"]
    # A new process reads the same failures: still capped.
    world.clock.advance(timedelta(minutes=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    world.pilot(retry_cap=3).round()
    assert world.lines("change")[-1]["result"] == "capped"
    # An hour after the first failure it is tried again, and goes through.
    world.stack.failing = 0
    world.clock.advance(timedelta(minutes=50))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    pilot.round()
    assert world.lines("change")[-1]["result"] == "applied"
    assert world.stack.config["generations"] == {"home-0": 2}


def test_a_bad_policy_is_refused_by_path_before_any_update(tmp_path: Path) -> None:
    world = World(tmp_path, SCALE, {"home": 2})
    world.stack.config["autopilot"]["scale"]["groups"]["home"] = {"min": 5, "max": 3}
    world.signals.answer = answer(world.clock, world.names(), refused={"home": 100})
    with pytest.raises(ConfigError) as refused:
        world.pilot().round()
    assert "autopilot.scale.groups.home.min: greater than max (3) (got 5)" in str(refused.value)
    assert world.stack.edits == [] and world.stack.updates == [] and world.signals.windows == []


def test_the_loop_logs_a_rounds_error_and_goes_on(tmp_path: Path) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.signals.answer = {"now": "not a time"}
    world.pilot().run(interval=60, rounds=3)
    assert [line["result"] for line in world.lines("round")] == ["error"] * 3
    assert sum(world.clock.slept) == 120
    assert b'egress_autopilot_rounds_total{result="error"} 3.0' in world.status.metrics()


def test_status_and_metrics_are_served(tmp_path: Path) -> None:
    policy = {"recycle": {**RECYCLE["recycle"], "unhealthyFor": "30m"}}
    world = World(tmp_path, policy, {"home": 3})
    world.clock.advance(timedelta(hours=1))
    health = {"home-2": "unhealthy"}
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3}, health=health)
    world.pilot().round()
    server = serve(world.status, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status = httpx.get(f"{base}/status").json()
        assert status["stack"] == "sim" and status["lastRound"]["result"] == "planned"
        metrics = httpx.get(f"{base}/metrics").text
        assert 'egress_autopilot_changes_total{kind="recycle",result="applied"} 1.0' in metrics
        # home-2 down since this round: watched, not recycled yet.
        assert status["unhealthySince"] == {"home-2": world.clock.now().isoformat()}
        assert "egress_autopilot_unhealthy_proxies 1.0" in metrics
        assert httpx.get(f"{base}/nothing").status_code == 404
    finally:
        server.shutdown()
