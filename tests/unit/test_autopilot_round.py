"""The autopilot's round (proxyinfra/autopilot/run.py) on a fake stack, a fake
clock and fake signals: what it changes, in what order, with which message
and targets, and the safety rules (the lock waited for, a failed update
undone, backed off and capped, dry run and pause changing nothing, a bad
policy refused before any update)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxyinfra.autopilot.log import DecisionLog
from proxyinfra.autopilot.memory import MemoryFiles
from proxyinfra.autopilot.run import Autopilot, Options
from proxyinfra.autopilot.seam import (
    Deployed,
    DeployedResource,
    StackBusy,
    Updated,
    UpdateFailed,
)
from proxyinfra.autopilot.status import Status, serve
from proxyinfra.autopilot.targets import proxy_urn
from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.generations import replica_name
from proxyinfra.validation import ConfigError
from tests.support.stack_config import key_files, kvm_provider, placement, proxy, stack_config

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
PROJECT = "egress-proxies"


class FakeClock:
    def __init__(self) -> None:
        self.at = T0
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return (self.at - T0).total_seconds()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += timedelta(seconds=seconds)

    def advance(self, delta: timedelta) -> None:
        self.at += delta


class FakeStack:
    """The seam as the Automation API implements it, in memory: config edits
    by path, updates recorded (each makes the replicas it targets, at the
    clock's time), a lock held for a number of polls, failures on demand."""

    name = "sim"

    def __init__(self, config: dict[str, Any], clock: FakeClock) -> None:
        self.config = config
        self.clock = clock
        self.made: dict[str, datetime] = {}
        self.updates: list[tuple[str, tuple[str, ...]]] = []
        self.edits: list[tuple[str, int | None]] = []
        self.reads = 0
        self.locked_polls = 0  # lock_holder answers a holder this many more times
        self.busy_updates = 0  # update raises StackBusy this many more times
        self.failing = 0  # update raises UpdateFailed this many more times
        self._deploy()

    def _names(self) -> list[str]:
        generations = self.config.get("generations", {})
        return [
            replica_name(slot, generations.get(slot, 1))
            for entry in self.config["proxies"]
            for slot in (f"{entry['name']}-{i}" for i in range(entry.get("replicas", 1)))
        ]

    def _deploy(self) -> None:
        self.made = {n: self.made.get(n, self.clock.now()) for n in self._names()}

    def read(self) -> Deployed:
        self.reads += 1
        resources = [
            DeployedResource(proxy_urn(self.name, PROJECT, n), PROXY_TYPE, None, t)
            for n, t in self.made.items()
        ]
        return Deployed(json.loads(json.dumps(self.config)), resources)

    def set_config(self, path: str, value: int | None) -> None:
        self.edits.append((path, value))
        if found := re.fullmatch(r"generations\.(.+)", path):
            table = self.config.setdefault("generations", {})
            key = found.group(1)
        elif found := re.fullmatch(r"proxies\[(\d+)\]\.replicas", path):
            table, key = self.config["proxies"][int(found.group(1))], "replicas"
        else:
            raise AssertionError(f"unexpected config path {path}")
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value

    def lock_holder(self) -> str | None:
        if self.locked_polls > 0:
            self.locked_polls -= 1
            return "ops@laptop (pid 4242) since 2026-12-04T11:59:00Z"
        return None

    def update(self, message: str, targets: Sequence[str], registers: Sequence[str]) -> Updated:
        if self.busy_updates > 0:
            self.busy_updates -= 1
            raise StackBusy("ops@laptop (pid 4242) since 2026-12-04T11:59:00Z")
        if self.failing > 0:
            self.failing -= 1
            raise UpdateFailed("error: the host refused the domain")
        self.updates.append((message, tuple(targets)))
        self._deploy()
        return Updated(len(self.updates) + 10, {"create": 1})


class FakeSignals:
    def __init__(self) -> None:
        self.answer: dict[str, Any] = {}
        self.windows: list[int] = []

    def fetch(self, window_seconds: int) -> Mapping[str, Any]:
        self.windows.append(window_seconds)
        return self.answer


def answer(
    clock: FakeClock,
    names: Sequence[str],
    *,
    blocked: Mapping[str, int] | None = None,
    refused: Mapping[str, int] | None = None,
    leased: Mapping[str, int] | None = None,
    window: int = 600,
) -> dict[str, Any]:
    """GET /v1/signals's answer for replicas NAMES (all healthy)."""
    blocked, refused, leased = blocked or {}, refused or {}, leased or {}
    last = (clock.now() - timedelta(seconds=30)).isoformat()
    groups = sorted({n.split("-")[0] for n in names})
    return {
        "now": clock.now().isoformat(),
        "windowSeconds": window,
        "proxies": [
            {
                "name": n,
                "group": n.split("-")[0],
                "health": "healthy",
                "leased": False,
                "blockedSites": blocked.get(n, 0),
                "blocks": blocked.get(n, 0),
                "lastBlockedAt": last if blocked.get(n) else None,
            }
            for n in names
        ],
        "groups": [
            {"name": g, "refused": refused.get(g, 0), "leased": leased.get(g, 0)} for g in groups
        ],
    }


class World:
    def __init__(
        self, tmp_path: Path, policy: Mapping[str, Any], replicas: Mapping[str, int]
    ) -> None:
        key, known = key_files(tmp_path)
        provider = kvm_provider(key, known)
        config = stack_config(
            [provider],
            [proxy(name, "home", replicas=n, where=placement()) for name, n in replicas.items()],
        )
        config["autopilot"] = json.loads(json.dumps(policy))
        self.clock = FakeClock()
        self.stack = FakeStack(config, self.clock)
        self.signals = FakeSignals()
        self.out = io.StringIO()
        self.files = MemoryFiles(tmp_path / "state" / "sim.json")
        self.status = Status("sim")
        self.tmp_path = tmp_path

    def pilot(self, **options: Any) -> Autopilot:
        return Autopilot(
            self.stack,
            self.signals,
            self.clock,
            DecisionLog("sim", self.clock.now, self.out),
            self.files,
            self.status,
            Options(project=PROJECT, project_dir=self.tmp_path, **options),
        )

    def names(self) -> list[str]:
        return list(self.stack.made)

    def lines(self, event: str | None = None) -> list[dict[str, Any]]:
        found = [json.loads(line) for line in self.out.getvalue().splitlines()]
        return [line for line in found if event is None or line["event"] == event]


RECYCLE = {"recycle": {"bannedSites": 3, "window": "10m", "healthyFloor": 1}}
SCALE = {
    "scale": {"groups": {"home": {"min": 2, "max": 4}}, "settle": "15m"},
    "maxChangesPerRound": 1,
}


def urn(name: str) -> str:
    return proxy_urn("sim", PROJECT, name)


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
    assert line["proxies"] == ["home-0", "home-0-g2"]
    assert line["signal"]["blockedSites"] == 3 and line["signal"]["healthy"] is True
    assert line["message"] == message and line["duration"] == 0
    assert world.files.path.exists()


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
    world.pilot(lock_timeout=120).round()
    assert world.stack.edits == [] and world.stack.updates == []
    [line] = world.lines("change")
    assert line["result"] == "lock-timeout"
    assert sum(world.clock.slept) >= 120


def test_a_failed_update_is_undone_backed_off_and_capped_per_hour(tmp_path: Path) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.stack.failing = 100
    pilot = world.pilot(retry_cap=3, backoff=timedelta(minutes=1))
    results = []
    for _ in range(12):
        world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
        pilot.round()
        results.append(world.lines("change")[-1]["result"])
        world.clock.advance(timedelta(seconds=50))
    assert "generations" not in world.stack.config or world.stack.config["generations"] == {}
    # Failed at 0 s; backoff 1 min, then 2 min; after 3 failures held for the hour.
    assert results[:7] == ["failed", "backoff", "failed", "backoff", "backoff", "failed", "capped"]
    assert set(results[7:]) == {"capped"}
    assert len([r for r in results if r == "failed"]) == 3
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
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    world.pilot().round()
    server = serve(world.status, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status = httpx.get(f"{base}/status").json()
        assert status["stack"] == "sim" and status["lastRound"]["result"] == "planned"
        metrics = httpx.get(f"{base}/metrics").text
        assert 'egress_autopilot_changes_total{kind="recycle",result="applied"} 1.0' in metrics
        assert httpx.get(f"{base}/nothing").status_code == 404
    finally:
        server.shutdown()
