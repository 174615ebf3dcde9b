"""The autopilot grows a group only as far as its kvm host has room, through
the real Pulumi CLI on a simulated kvm host, with the real discovery service.

The host's room is what the kvm provider's own creates check, read by the
autopilot over the same connection seam: the simulated host's pool has
100 GiB available (libvirt's test driver; thin overlays take none of it) and
each overlay is 60 GiB (``diskSizeGb``), so there is room for one more
replica, whatever the memory (the simulated host has 1 TiB free). Demand asks
for two more (``step: 2``): the group grows by one, and the decision log
says what the room held back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.autopilot_cli import World
from tests.support.baseimages import random_qcow2, serve
from tests.support.discovery import ServerThread, settings_for, wait_for
from tests.support.http import FileServer
from tests.support.pulumi_cli import PROJECT, CliStack
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import (
    host,
    image,
    key_files,
    kvm_provider,
    placement,
    proxy,
    stack_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]
TOKEN = "autopilot-room-token"
STACK = "room"
DISK_GB = 60  # the simulated pool's 100 GiB hold one more such overlay, not two

POLICY: dict[str, Any] = {
    "scale": {"groups": {"home": {"min": 1, "max": 5}}, "step": 2, "settle": "1s"},
    "maxChangesPerRound": 2,
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    where = tmp_path_factory.mktemp("autopilot-room")
    with FileServer() as server:
        url = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16)).url
        provider = kvm_provider(
            *key_files(where), hosts=[host("nas1")], images={"d": image(url)}, ip_timeout=30
        )
        provider["kvm"]["diskSizeGb"] = DISK_GB  # the key this test is about
        config = stack_config(
            [provider], [proxy("home", "home", replicas=1, where=placement(), labels={"g": "h"})]
        )
        config["autopilot"] = POLICY
        stack = CliStack(where / "stack", STACK, config, simulated_env(where / "hosts"))
        fleet = where / "fleet.json"
        stack.ok("up", "--yes", "--skip-preview")
        fleet.write_text(stack.ok("stack", "output", "--json", "--show-secrets").stdout)
        settings = settings_for(where, fleet_files=(fleet,), token=TOKEN, file_poll=0.1)
        with ServerThread(settings) as service:
            state = where / "stack" / "state" / "autopilot" / PROJECT / f"{STACK}.json"
            yield World(stack, where / "hosts", fleet, service, state, STACK, TOKEN)
        stack.run("destroy", "--yes", "--skip-preview")


def _wanted(world: World) -> None:
    """Its one proxy leased, then 30 grants refused within the window (10m):
    3 a minute, over unmetPerMinute 1."""
    with world.http() as http:
        wait_for(lambda: http.get("/v1/proxies").json()["proxies"] != [], what="the fleet served")
        assert http.post("/v1/leases", json={"holder": "busy"}).status_code == 201
        for _ in range(30):
            assert http.post("/v1/leases", json={"holder": "waiting"}).status_code == 409


def test_a_group_grows_only_as_far_as_its_hosts_room(world: World) -> None:
    _wanted(world)
    history = json.loads(world.stack.ok("stack", "history", "--json").stdout)
    done = world.autopilot("--once")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    [change] = [d for d in lines if d["event"] == "change"]
    assert (change["kind"], change["rule"], change["result"]) == ("scale", "demand", "applied")
    assert change["proxies"] == ["home-1"]  # one more, not two
    assert change["message"].startswith("autopilot: scale home from 1 to 2: ")
    assert change["message"].endswith("; room for 1 more on home/nas1")
    [held] = [d for d in lines if d["event"] == "held"]
    assert held["subject"] == "home" and held["rule"] == "demand"
    assert held["message"].endswith("1 of them not now: room for 1 more on home/nas1 only")
    assert world.replicas() == {"home": 2}
    after = json.loads(world.stack.ok("stack", "history", "--json").stdout)
    assert len(after) == len(history) + 1 and after[0]["message"] == change["message"]
