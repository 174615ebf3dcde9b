"""The autopilot's round on fakes (a stack, a clock, the service's signals)
for the unit tests of proxyinfra/autopilot/run.py: one World per test, the
decision log it wrote read back as JSON lines."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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
from proxyinfra.autopilot.status import Status
from proxyinfra.autopilot.targets import proxy_urn
from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.generations import replica_name
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
        self.checkpoints: list[bool] = []  # each update's, in order
        self.edits: list[tuple[str, int | None]] = []
        self.reads = 0
        self.locked_polls = 0  # lock_holder answers a holder this many more times
        self.busy_updates = 0  # update raises StackBusy this many more times
        self.failing = 0  # update raises UpdateFailed this many more times
        self.refreshes: list[tuple[str, ...]] = []
        self.refresh_failing = 0  # refresh raises UpdateFailed this many more times
        self.during: Callable[[], None] | None = None  # called inside each update
        self.deploy()

    def _names(self) -> list[str]:
        generations = self.config.get("generations", {})
        return [
            replica_name(slot, generations.get(slot, 1))
            for entry in self.config["proxies"]
            for slot in (f"{entry['name']}-{i}" for i in range(entry.get("replicas", 1)))
        ]

    def deploy(self) -> None:
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

    def update(
        self,
        message: str,
        targets: Sequence[str],
        registers: Sequence[str],
        *,
        checkpoints: bool = True,
    ) -> Updated:
        if self.busy_updates > 0:
            self.busy_updates -= 1
            raise StackBusy("ops@laptop (pid 4242) since 2026-12-04T11:59:00Z")
        if self.failing > 0:
            self.failing -= 1
            raise UpdateFailed("error: the host refused the domain")
        if self.during is not None:
            self.during()
        self.updates.append((message, tuple(targets)))
        self.checkpoints.append(checkpoints)
        self.deploy()
        return Updated(len(self.updates) + 10, {"create": 1})

    def refresh(self, targets: Sequence[str]) -> None:
        if self.busy_updates > 0:
            self.busy_updates -= 1
            raise StackBusy("ops@laptop (pid 4242) since 2026-12-04T11:59:00Z")
        if self.refresh_failing > 0:
            self.refresh_failing -= 1
            raise UpdateFailed("error: the host did not answer")
        self.refreshes.append(tuple(targets))


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
    health: Mapping[str, str] | None = None,
    window: int = 600,
) -> dict[str, Any]:
    """GET /v1/signals's answer for replicas NAMES (healthy unless HEALTH says)."""
    blocked, refused, leased = blocked or {}, refused or {}, leased or {}
    health = health or {}
    last = (clock.now() - timedelta(seconds=30)).isoformat()
    groups = sorted({n.split("-")[0] for n in names})
    return {
        "now": clock.now().isoformat(),
        "windowSeconds": window,
        "proxies": [
            {
                "name": n,
                "group": n.split("-")[0],
                "health": health.get(n, "healthy"),
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
