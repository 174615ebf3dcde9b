"""The room of each place for the autopilot's planner (proxyinfra/autopilot/room.py):
the places' answers turned into the planner's Room and placed groups, and
the kvm backend's reading of them from a host, through the connection seam
the provider uses (a simulated host; a real SSH connection to a closed port
for a host that cannot be reached)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from providers.kvm import connection, resource
from providers.kvm.access import HostAccess
from providers.kvm.connection import connect, use_connector
from providers.kvm.simulated import SimulatedHost
from proxyinfra.autopilot.changes import PlannerState
from proxyinfra.autopilot.fleet import FleetGroup, Room, groups_of_stack
from proxyinfra.autopilot.log import DecisionLog
from proxyinfra.autopilot.memory import MemoryFiles
from proxyinfra.autopilot.plan import plan
from proxyinfra.autopilot.policy import AutopilotPolicy
from proxyinfra.autopilot.room import ROOM_RULE, BackendRoom, room_from
from proxyinfra.autopilot.run import Autopilot, Options
from proxyinfra.autopilot.seam import Deployed, Updated
from proxyinfra.autopilot.signals import GroupSignal, Signals
from proxyinfra.autopilot.status import Status
from proxyinfra.backend import Place, RoomUnknown
from proxyinfra.config import StackConfig
from proxyinfra.validation import validate
from tests.support.stack_config import (
    external_provider,
    host,
    key_files,
    kvm_provider,
    machine_type,
    placement,
    proxy,
    stack_config,
)

GIB = 1024**3
MIB = 1024**2
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _group(name: str, backend: str = "kvm", replicas: int = 1) -> FleetGroup:
    return FleetGroup(name, "home", backend, replicas, ())


def test_answers_become_the_planners_room_and_an_unreadable_place_is_held() -> None:
    groups = [_group("a"), _group("b"), _group("c"), _group("pods", "kubernetes")]
    needs = {"memory": 512 * MIB, "disk": 10 * GIB}
    places = {
        "a": Place("home/nas1", needs),
        "b": Place("home/nas1", needs),
        "c": Place("home/nas2", needs),
    }
    answers: dict[str, Mapping[str, int] | RoomUnknown] = {
        "home/nas1": {"memory": 3 * GIB, "disk": 25 * GIB},
        "home/nas2": RoomUnknown("host 'nas2' (virt@192.0.2.2:22): cannot connect: refused"),
    }
    read = room_from(groups, places, answers)
    assert [(g.name, g.place, dict(g.needs)) for g in read.groups] == [
        ("a", "home/nas1", needs),
        ("b", "home/nas1", needs),
        ("c", "home/nas2", needs),
        ("pods", None, {}),  # a backend that knows no room: no place, no limit but max
    ]
    assert read.room == Room({"home/nas1": {"memory": 3 * GIB, "disk": 25 * GIB}})
    [held] = read.held
    assert (held.subject, held.rule) == ("home/nas2", ROOM_RULE)
    assert "host 'nas2' (virt@192.0.2.2:22): cannot connect: refused" in held.message
    # What the planner makes of it: disk for 2 more on nas1, none known on nas2.
    assert read.room.fits(read.groups[0], {}) == 2
    assert read.room.fits(read.groups[2], {}) == 0
    assert read.room.fits(read.groups[3], {}) is None


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a started provider process (start() does nothing more);
    the connection seam is put back afterwards."""
    monkeypatch.setattr(resource, "_started", True)
    monkeypatch.setattr(connection, "_connector", connection._connector)


def _config(tmp_path: Path, address: str = "192.0.2.1:22", key: Path | None = None) -> StackConfig:
    key_file, known = key_files(tmp_path)
    provider = kvm_provider(
        key or key_file,
        known,
        hosts=[host("nas1", address), host("nas2", "192.0.2.2:22")],
        machine_types={"s": machine_type(memory_mib=1024), "l": machine_type(memory_mib=4096)},
    )
    provider["kvm"]["diskSizeGb"] = 20
    return validate(
        stack_config(
            [provider, external_provider("corp")],
            [
                proxy("small", "home", replicas=2, where=placement("s", zone="nas1")),
                proxy("large", "home", where=placement("l", zone="nas1")),
                proxy("other", "home", where=placement("s", zone="nas2")),
                proxy("corp-1", "corp", url="http://192.0.2.9:3128"),
            ],
        ),
        tmp_path,
    )


def _groups(config: StackConfig) -> list[FleetGroup]:
    return groups_of_stack(config, {})


@pytest.mark.usefixtures("started")
def test_a_kvm_hosts_room_is_what_its_creates_check(tmp_path: Path) -> None:
    config = _config(tmp_path)
    nas1 = SimulatedHost(tmp_path / "nas1", pool="default", network="n")
    nas1.free_memory = 6 * GIB
    asked: list[str] = []

    def connector(access: HostAccess) -> SimulatedHost:
        asked.append(access.host)
        return nas1

    try:
        with use_connector(connector):
            read = BackendRoom().read(config, _groups(config), {"small", "large", "corp-1"})
        pool = nas1.libvirt().storagePoolLookupByName("default").info()
    finally:
        nas1.close()
    placed = {g.name: (g.place, dict(g.needs)) for g in read.groups}
    assert placed == {
        "small": ("home/nas1", {"memory": 1024 * MIB, "disk": 20 * GIB}),
        "large": ("home/nas1", {"memory": 4096 * MIB, "disk": 20 * GIB}),
        "other": (None, {}),  # not a group the policy scales: its host is not asked
        "corp-1": (None, {}),  # external: no room known
    }
    assert asked == ["nas1"]  # one place, read once for both of its groups
    assert read.room == Room({"home/nas1": {"memory": 6 * GIB, "disk": pool[3]}})
    assert read.held == ()


def _closed_port(tmp_path: Path) -> tuple[Path, int]:
    """A usable SSH key, and a port on this machine nothing listens on: a
    host that refuses the connection, reached the way the provider reaches one."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return key, probe.getsockname()[1]


@pytest.mark.usefixtures("started")
def test_a_host_that_cannot_be_reached_has_no_room_and_is_named(tmp_path: Path) -> None:
    key, port = _closed_port(tmp_path)
    config = _config(tmp_path, f"127.0.0.1:{port}", key)
    with use_connector(connect):
        read = BackendRoom().read(config, _groups(config), {"small"})
    assert read.room == Room({})
    [held] = read.held
    assert held.subject == "home/nas1" and held.rule == ROOM_RULE
    assert f"host 'nas1' (virt@127.0.0.1:{port}, provider 'home'): cannot connect" in held.message
    # The planner then scales nothing up there, however busy the group.
    policy = AutopilotPolicy.model_validate({"scale": {"groups": {"small": {"min": 1, "max": 5}}}})
    busy = Signals(NOW, timedelta(minutes=10), groups={"small": GroupSignal(refused=50, leased=2)})
    result = plan(policy, read.groups, busy, read.room, PlannerState(), NOW)
    assert result.changes == ()
    assert result.held[0].reason.endswith("but no room on home/nas1 for one more replica")


class _Stack:
    """The stack seam as far as a dry run reads it: its config, no resource."""

    name = "sim"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def read(self) -> Deployed:
        return Deployed(self.config, [])

    def lock_holder(self) -> str | None:
        raise AssertionError("a dry run takes no lock")

    def set_config(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run writes no config")

    def update(self, *args: Any, **kwargs: Any) -> Updated:
        raise AssertionError("a dry run runs no update")

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run refreshes nothing")


class _Signals:
    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer = answer

    def fetch(self, window_seconds: int) -> Mapping[str, Any]:
        return self.answer


class _Clock:
    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        raise AssertionError("a dry run waits for nothing")


@pytest.mark.usefixtures("started")
def test_a_round_logs_the_unreadable_host_and_scales_nothing_there(tmp_path: Path) -> None:
    key, port = _closed_port(tmp_path)
    _, known = key_files(tmp_path)
    provider = kvm_provider(key, known, hosts=[host("nas1", f"127.0.0.1:{port}")])
    raw = stack_config([provider], [proxy("small", "home", where=placement())])
    raw["autopilot"] = {"scale": {"groups": {"small": {"min": 1, "max": 5}}}}
    busy = {
        "now": NOW.isoformat(),
        "windowSeconds": 600,
        "proxies": [],
        "groups": [{"name": "small", "refused": 50, "leased": 1}],
    }
    out = io.StringIO()
    clock = _Clock()
    pilot = Autopilot(
        _Stack(raw),
        _Signals(busy),
        clock,
        DecisionLog("sim", clock.now, out),
        MemoryFiles(tmp_path / "state" / "sim.json"),
        Status("sim"),
        Options(project="egress-proxies", project_dir=tmp_path, dry_run=True),
        room=BackendRoom(),
    )
    with use_connector(connect):
        assert pilot.round() == "dry-run"
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["event"], d.get("subject"), d.get("rule")) for d in lines] == [
        ("held", "home/nas1", ROOM_RULE),  # the host, and why
        ("held", "small", "demand"),  # the scale-up it holds
        ("round", None, None),
    ]
    assert f"host 'nas1' (virt@127.0.0.1:{port}, provider 'home')" in lines[0]["message"]
    assert lines[1]["message"].endswith("but no room on home/nas1 for one more replica")
    assert lines[2]["changes"] == 0 and lines[2]["held"] == 2
