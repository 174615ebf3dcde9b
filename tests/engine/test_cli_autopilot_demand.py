"""The autopilot's demand, idle and healthy-floor rules through the real
Pulumi CLI on a simulated kvm host, with the real discovery service (issue
40, Tests: "Demand"): ordered steps on one stack, each round one
`python -m proxyinfra autopilot --once` as cron runs it.

- `home` (min 2, max 4, step 1): crawlers kept waiting for grants raise it
  2 -> 3 -> 4, one change a round, and a further round holds it at `max`;
  the leases given back and no grant refused for `idleAfter`, rounds bring
  it back to 2 and no lower.
- `edge` (4 replicas, not scaled): proxies banned by several sites while two
  of them are down; the round recycles a down one and holds the healthy
  ones whose recycle would leave fewer than `healthyFloor` healthy.

`step` is 1 so that each change is visible as its own round and update: the
group reaches `max` by two changes under `maxChangesPerRound` 1, and `max`
holds the next one (with step 2, one change would reach `max` and the cap
would only be the planner's clamp of the target). The durations are the
policy's own time controls, in seconds: the window (20s: refused grants and
bans older than that no longer count), `settle` and `idleAfter` (2s); the
test waits for them instead of changing any clock.

The service's health verdicts come from a fake (tests/support/discovery.py,
every proxy healthy when it joins the fleet): "killing" a proxy is setting
its verdict `unhealthy`, which is all the service knows of a dead proxy and
all the autopilot reads (a simulated host runs no squid to stop), and a
replacement still booting is `unknown` until its first healthy probe.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

from health.model import Health
from tests.support.autopilot_cli import World, events
from tests.support.baseimages import random_qcow2, serve
from tests.support.discovery import ServerThread, settings_for
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
TOKEN = "autopilot-demand-token"
STACK = "demand"
WINDOW_S = 20
PAUSE_S = 2  # settle and idleAfter
FLOOR = 2

POLICY: dict[str, Any] = {
    "recycle": {"bannedSites": 3, "window": f"{WINDOW_S}s", "healthyFloor": FLOOR},
    "scale": {
        "groups": {"home": {"min": 2, "max": 4}},
        "step": 1,
        "unmetPerMinute": 1,
        "settle": f"{PAUSE_S}s",
        "idleAfter": f"{PAUSE_S}s",
    },
    "maxChangesPerRound": 1,
}
HOME = {"labels": {"group": "home"}}
EDGE = {"labels": {"group": "edge"}}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    where = tmp_path_factory.mktemp("autopilot-demand")
    with FileServer() as server:
        url = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16)).url
        provider = kvm_provider(
            *key_files(where), hosts=[host("nas1")], images={"d": image(url)}, ip_timeout=30
        )
        config = stack_config(
            [provider],
            [
                proxy("home", "home", replicas=2, where=placement(), labels={"group": "home"}),
                proxy("edge", "home", replicas=4, where=placement(), labels={"group": "edge"}),
            ],
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


class Round:
    """One `autopilot --once` and what it did: its changes, its held lines,
    and the updates `pulumi stack history` gained."""

    def __init__(self, world: World) -> None:
        before = len(world.history())
        self.done = world.autopilot("--once")
        assert self.done.returncode == 0, self.done.stdout + self.done.stderr
        self.changes = list(events(self.done, "change"))
        self.held = list(events(self.done, "held"))
        self.history = world.history()
        self.updates = len(self.history) - before
        # At most K changes a round (maxChangesPerRound 1), each one update.
        assert len(self.changes) <= 1, self.changes
        assert self.updates == len(self.changes), (self.updates, self.changes)
        assert all(c["result"] == "applied" for c in self.changes), self.changes

    def scaled(self) -> list[tuple[str, int, int]]:
        return [
            (c["group"], c["signal"]["replicas"], _after(c["message"]))
            for c in self.changes
            if c["kind"] == "scale"
        ]

    def recycled(self) -> list[str]:
        return [c["proxies"][0] for c in self.changes if c["kind"] == "recycle"]

    def held_for(self, subject: str) -> list[str]:
        return [h["message"] for h in self.held if h["subject"] == subject]


def _after(message: str) -> int:
    """The replicas a scale message says the group goes to ("scale home from 2 to 3: ...")."""
    return int(message.split(" to ", 1)[1].split(":", 1)[0])


# -- demand ---------------------------------------------------------------------------------


def _lease_all(http: httpx.Client, selector: Mapping[str, Any], holder: str) -> dict[str, str]:
    """Leases every free proxy the selector matches: proxy name -> lease id."""
    leases: dict[str, str] = {}
    body = {"holder": holder, "selector": selector, "ttlSeconds": 300}
    while (answer := http.post("/v1/leases", json=body)).status_code == 201:
        leases[answer.json()["proxy"]["name"]] = answer.json()["id"]
    assert answer.status_code == 409, answer.text
    return leases


def _waiting_crawlers(world: World, busy: dict[str, str], refused: int = 5) -> None:
    """Every `home` proxy leased (those the last update added too), then
    REFUSED grants for `home` refused: within the 20s window, 15 a minute,
    over unmetPerMinute 1."""
    with world.http() as http:
        busy |= _lease_all(http, HOME, "busy")
        for _ in range(refused):
            answer = http.post("/v1/leases", json={"holder": "waiting", "selector": HOME})
            assert answer.status_code == 409, answer.text


def _pause() -> None:
    """Past settle and idleAfter since the round before began."""
    time.sleep(PAUSE_S + 0.5)


# Leases held by the demand step's busy crawlers, given back by the idle step.
BUSY: dict[str, str] = {}


@pytest.mark.step
def test_waiting_crawlers_raise_home_2_to_4_one_change_a_round_never_past_max(
    world: World,
) -> None:
    steps = []
    for _ in range(2):
        _waiting_crawlers(world, BUSY)
        done = Round(world)
        steps += done.scaled()
        [change] = done.changes
        assert change["rule"] == "demand" and change["signal"]["window"] == WINDOW_S
        assert change["signal"]["refused"] >= 5 and change["signal"]["perMinute"] >= 1
        assert change["proxies"] == [f"home-{change['signal']['replicas']}"]  # the one that comes
        assert done.history[0]["message"] == change["message"]
        assert change["message"].startswith(
            f"autopilot: scale home from {change['signal']['replicas']} to "
        )
        world.publish()
        _pause()
    assert steps == [("home", 2, 3), ("home", 3, 4)]
    assert world.replicas() == {"home": 4, "edge": 4}
    # Demand goes on: the group is at its max, the round holds it and says so.
    _waiting_crawlers(world, BUSY)
    assert sorted(BUSY) == ["home-0", "home-1", "home-2", "home-3"]
    done = Round(world)
    assert done.changes == [] and done.updates == 0
    [held] = done.held_for("home")
    assert held.startswith("autopilot: not now: home: ") and "grants refused within 20s" in held
    assert held.endswith("; but at its max 4"), held
    assert world.replicas() == {"home": 4, "edge": 4}


@pytest.mark.step
def test_idle_home_goes_back_to_min_one_change_a_round_never_below(world: World) -> None:
    with world.http() as http:
        for lease in BUSY.values():
            assert http.delete(f"/v1/leases/{lease}").status_code == 204
    BUSY.clear()
    # No grant refused within the window from now on: the last refusals leave it.
    time.sleep(WINDOW_S + 1)
    rounds = [Round(world)]  # the first idle round starts the idle spell: no change yet
    assert rounds[0].changes == [] and rounds[0].held_for("home") == []
    while len(rounds) < 4:
        _pause()
        rounds.append(done := Round(world))
        if done.changes:
            world.publish()
    steps = [r.scaled() for r in rounds]
    assert steps == [[], [("home", 4, 3)], [("home", 3, 2)], []], steps
    for done in rounds[1:3]:
        [change] = done.changes
        assert change["rule"] == "idle" and change["signal"]["leased"] == 0
        # The highest replica leaves.
        assert change["proxies"] == [f"home-{change['signal']['replicas'] - 1}"]
        assert "(idleAfter 2s), 0 of" in change["message"], change["message"]
    assert world.replicas() == {"home": 2, "edge": 4}
    served = {p["name"] for p in json.loads(world.fleet.read_text())["fleet"]["proxies"]}
    assert sorted(n for n in served if n.startswith("home")) == ["home-0", "home-1"]


# -- the healthy floor ----------------------------------------------------------------------


def _set_health(world: World, verdicts: Mapping[str, Health]) -> None:
    """The service's verdicts, as its prober would change them (the listener told)."""
    service = world.service
    fake = service.fake
    assert fake is not None
    for name, verdict in verdicts.items():
        service.call(functools.partial(fake.set, name, verdict, "set by the test"))


def _report(world: World, leases: Mapping[str, str], sites: Mapping[str, int]) -> None:
    """Proxy NAME reported blocked by sites[NAME] distinct sites, through the
    crawler's lease on it (a lease outlives its proxy's health)."""
    with world.http() as http:
        for name, count in sites.items():
            for n in range(1, count + 1):
                answer = http.post(
                    f"/v1/leases/{leases[name]}/report",
                    json={"outcome": "blocked", "target": f"site-{n}.example"},
                )
                assert answer.status_code == 204, answer.text


def _floor_held(done: Round, name: str) -> None:
    [held] = done.held_for(name)
    assert "blocked by 4 distinct sites" in held, held
    assert held.endswith(
        f"; but it would leave {FLOOR - 1} healthy proxies in edge, below healthyFloor {FLOOR}"
    ), held


@pytest.mark.step
def test_recycling_never_takes_a_group_below_its_healthy_floor(world: World) -> None:
    with world.http() as http:
        leases = _lease_all(http, EDGE, "crawler")
    assert sorted(leases) == ["edge-0", "edge-1", "edge-2", "edge-3"]
    # Four sites ban the healthy edge-0 and edge-1 (first in the round's
    # order: most sites first), three the two that are then killed.
    bans = {"edge-0": 4, "edge-1": 4, "edge-2": 3, "edge-3": 3}
    _report(world, leases, bans)
    _set_health(world, {"edge-2": Health.UNHEALTHY, "edge-3": Health.UNHEALTHY})
    done = Round(world)
    # A down one (the older first; both were made by one update): recycling
    # it costs the floor nothing.
    [first] = done.recycled()
    assert first in ("edge-2", "edge-3") and done.changes[0]["signal"]["healthy"] is False
    [second] = {"edge-2", "edge-3"} - {first}
    _floor_held(done, "edge-0")
    _floor_held(done, "edge-1")
    [k] = done.held_for(second)
    assert k.endswith("; but 1 changes this round already (maxChangesPerRound 1)"), k
    # The replacement joins the fleet and is still booting (not yet probed healthy).
    fleet = {p["name"] for p in world.publish()["proxies"]}
    assert {f"{first}-g2", second} <= fleet and first not in fleet
    _set_health(world, {f"{first}-g2": Health.UNKNOWN})
    _report(world, leases, {"edge-0": 4, "edge-1": 4, second: 3})  # still within the window
    done = Round(world)
    assert done.recycled() == [second]
    _floor_held(done, "edge-0")
    _floor_held(done, "edge-1")
    # The held ones got no update: only the two recycles are in the history.
    recycles = [h["message"] for h in done.history if "recycle" in h.get("message", "")]
    assert [m.split(" (", 1)[0] for m in recycles] == [
        f"autopilot: recycle {second}",
        f"autopilot: recycle {first}",
    ]
    assert world.config()["generations"] == {"edge-2": 2, "edge-3": 2}
    # Rolling: once both replacements are healthy, one healthy banned proxy
    # may go (4 healthy, 3 left), and K holds the next.
    world.publish()
    _set_health(world, {"edge-2-g2": Health.HEALTHY, "edge-3-g2": Health.HEALTHY})
    _report(world, leases, {"edge-0": 4, "edge-1": 4})
    done = Round(world)
    [third] = done.recycled()
    assert third in ("edge-0", "edge-1") and done.changes[0]["signal"]["healthy"] is True
    [k] = done.held_for(({"edge-0", "edge-1"} - {third}).pop())
    assert k.endswith("; but 1 changes this round already (maxChangesPerRound 1)"), k
    assert world.replicas() == {"home": 2, "edge": 4}
