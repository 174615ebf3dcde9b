"""`python -m proxyinfra autopilot` through the real Pulumi CLI on simulated
kvm hosts, with the real discovery service (its leases, reports and refused
grants through the HTTP API), as an operator runs it: ordered steps on one
stack (groups `home`, 2 replicas, and `edge`, 1).

The service reads the fleet from a file the test writes from `pulumi stack
output --json --show-secrets` after each update (the documented way to feed
it a stack's manifest): what it serves is the stack output each targeted
update wrote. Its health verdicts come from a fake (every proxy healthy), so
that crawlers can lease the simulated proxies and report them blocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import pytest
from pulumi import automation as auto

from health.model import Health
from proxyinfra.autopilot.automation import AutomationStack
from proxyinfra.autopilot.targets import proxy_urn
from tests.support.autopilot_cli import World, decisions
from tests.support.baseimages import random_qcow2, serve
from tests.support.discovery import ServerThread, settings_for, wait_for
from tests.support.http import FileServer
from tests.support.pulumi_cli import PROJECT, CliStack, descendants, freeze_run
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import (
    external_provider,
    host,
    image,
    key_files,
    kvm_provider,
    placement,
    proxy,
    stack_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]
TOKEN = "autopilot-test-token"
STACK = "auto"
# As --stack takes it here: qualified, as an operator with several projects
# names it (the engine's URNs, the stack file and the backend's paths use the
# short name; the other autopilot modules give the plain one).
QUALIFIED = f"organization/{PROJECT}/{STACK}"
WINDOW_S = 30


POLICY: dict[str, Any] = {
    # A short window: a proxy is recycled for its bans only once it is older
    # than the window (its count could hold its old address's bans otherwise).
    "recycle": {"bannedSites": 3, "window": f"{WINDOW_S}s", "healthyFloor": 1},
    "scale": {
        "groups": {"home": {"min": 2, "max": 3}, "edge": {"min": 1, "max": 2}},
        "settle": "1s",
    },
    "maxChangesPerRound": 1,
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    where = tmp_path_factory.mktemp("autopilot")
    with FileServer() as server:
        url = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16)).url
        provider = kvm_provider(
            *key_files(where), hosts=[host("nas1")], images={"d": image(url)}, ip_timeout=30
        )
        # An external proxy: its manifest entry has a null zone, which the
        # engine drops from the outputs a partial run reads back.
        config = stack_config(
            [provider, external_provider("corp")],
            [
                proxy("home", "home", replicas=2, where=placement(), labels={"group": "home"}),
                proxy("edge", "home", where=placement(), labels={"group": "edge"}),
                proxy("partner", "corp", url="http://crawler:partner-pass@127.0.0.1:9"),
            ],
        )
        config["autopilot"] = POLICY
        stack = CliStack(where / "stack", STACK, config, simulated_env(where / "hosts"))
        fleet = where / "fleet.json"
        settings = settings_for(where, fleet_files=(fleet,), token=TOKEN, file_poll=0.1)
        stack.ok("up", "--yes", "--skip-preview")
        outputs = json.loads(stack.ok("stack", "output", "--json", "--show-secrets").stdout)
        fleet.write_text(json.dumps(outputs))
        with ServerThread(settings) as service:
            state = where / "stack" / "state" / "autopilot" / PROJECT / f"{STACK}.json"
            yield World(stack, where / "hosts", fleet, service, state, QUALIFIED, TOKEN)
        stack.run("destroy", "--yes", "--skip-preview")


@pytest.mark.step
def test_a_bad_policy_is_refused_by_path_before_any_update(world: World) -> None:
    before = world.history()
    world.stack.write_config({**world.config(), "autopilot": {**POLICY, "maxChangesPerRound": 0}})
    try:
        done = world.autopilot("--once")
    finally:
        world.stack.write_config({**world.config(), "autopilot": POLICY})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "autopilot.maxChangesPerRound" in done.stderr and "(got 0)" in done.stderr
    assert world.history() == before and not world.state.exists()


def _blocked_by_three_sites(world: World) -> None:
    """Three sites report home-0 blocked, through leases on it: the first
    grant is home-0 (never leased, by name), then home-1 is held so that
    the next grants can only be home-0."""
    with world.http() as http:

        def grant() -> dict[str, Any]:
            answer = http.post(
                "/v1/leases", json={"holder": "crawler", "selector": {"labels": {"group": "home"}}}
            )
            assert answer.status_code == 201, answer.text
            return answer.json()  # type: ignore[no-any-return]

        first = grant()
        assert first["proxy"]["name"] == "home-0"
        for n, lease in enumerate([first, None, None], start=1):
            if lease is None:
                lease = grant()
            assert lease["proxy"]["name"] == "home-0"
            reported = http.post(
                f"/v1/leases/{lease['id']}/report",
                json={"outcome": "blocked", "target": f"site-{n}.example"},
            )
            assert reported.status_code == 204, reported.text
            assert http.delete(f"/v1/leases/{lease['id']}").status_code == 204
            if n == 1:
                held = grant()
                assert held["proxy"]["name"] == "home-1"
        assert http.delete(f"/v1/leases/{held['id']}").status_code == 204


def _older_than_the_window(world: World, name: str) -> None:
    """Waits until replica NAME was made more than the window ago."""
    [made] = [
        r["created"]
        for r in world.stack.resources()
        if r["type"] == "egress-proxies:fleet:Proxy" and r["urn"].endswith(f"::{name}")
    ]
    age = time.time() - datetime.fromisoformat(made).timestamp()
    time.sleep(max(0.0, WINDOW_S + 1 - age))


@pytest.mark.step
def test_dry_run_and_pause_change_nothing(world: World) -> None:
    _older_than_the_window(world, "home-0")
    _blocked_by_three_sites(world)
    history, config = world.history(), world.stack.stack_file.read_bytes()
    done = world.autopilot("--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    [change] = [d for d in decisions(done) if d["event"] == "change"]
    assert change["result"] == "dry-run" and change["proxies"] == ["home-0", "home-0-g2"]
    assert world.history() == history and world.stack.stack_file.read_bytes() == config
    assert not world.state.exists()
    # Paused: a round says so and changes nothing, its state file included.
    world.state.parent.mkdir(parents=True, exist_ok=True)
    world.state.write_text('{"version": 1, "groups": {}, "failures": {}}\n')
    kept = world.state.read_bytes()
    assert world.autopilot("pause").returncode == 0
    done = world.autopilot("--once")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [d["result"] for d in decisions(done)] == ["paused"]
    assert world.history() == history and world.stack.stack_file.read_bytes() == config
    assert world.state.read_bytes() == kept
    assert "resumed" in world.autopilot("resume").stdout


@pytest.mark.step
def test_a_proxy_blocked_by_three_sites_is_replaced_by_once(world: World) -> None:
    old_mac = world.mac("home-0")
    old = {p["name"]: p for p in json.loads(world.fleet.read_text())["fleet"]["proxies"]}
    done = world.autopilot("--once")
    assert done.returncode == 0, done.stdout + done.stderr
    [change] = [d for d in decisions(done) if d["event"] == "change"]
    assert change["result"] == "applied", change
    assert change["signal"]["blockedSites"] == 3 and change["proxies"] == ["home-0", "home-0-g2"]
    assert world.config()["generations"] == {"home-0": 2}
    fleet = {p["name"]: p for p in world.publish()["proxies"]}
    assert sorted(fleet) == ["edge-0", "home-0-g2", "home-1", "partner"]
    assert fleet["home-0-g2"]["id"] != old["home-0"]["id"]
    assert fleet["home-1"] == old["home-1"]  # untouched
    assert fleet["edge-0"] == old["edge-0"]  # passwords too, from the previous output
    assert fleet["partner"] == old["partner"] and old["partner"]["zone"] is None
    assert world.mac("home-0-g2") != old_mac
    assert change["resources"].get("create") == 4 and change["resources"].get("delete") == 4
    # O(change): a partial run (proxyinfra/partial.py), which registers only the
    # replica that comes (tests/program/test_partial.py), read the stack's own
    # outputs for the others' entries; a whole run reads no stack.
    types = [r["type"] for r in world.stack.resources()]
    assert types.count("pulumi:pulumi:StackReference") == 1, types
    # ...and an operator's whole run after it finds nothing to do.
    world.stack.ok("preview", "--expect-no-changes")
    [last] = world.history()[:1]
    assert last["message"] == change["message"]
    assert last["message"].startswith(
        "autopilot: recycle home-0 (home): blocked by 3 distinct sites"
    )
    # A file backend numbers no update: the autopilot gives its ordinal in the history.
    assert change["update"] == len(world.history()) == 2


class _Recording(auto.PulumiCommand):
    """The real CLI, each command's arguments and added environment kept."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[str]] = []
        self.envs: list[dict[str, str]] = []

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: auto.OnOutput | None = None,
        on_error: auto.OnOutput | None = None,
    ) -> auto.CommandResult:
        self.seen.append(list(args))
        self.envs.append(dict(additional_env))
        return super().run(args, cwd, additional_env, on_output, on_error)


@pytest.mark.step
def test_the_autopilot_s_commands_reveal_no_secret(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What it reads of a stack (URNs, creation times, an update's summary) is
    not secret, so no command it runs decrypts the state's secrets into it;
    each would be one more read of the whole state, too (automation.py). On
    this file backend it reads the state's resources and counts the updates
    from the backend's files (statefile.py), a kvm update it asks to skip
    the checkpoints runs with PULUMI_SKIP_CHECKPOINTS (targets.py), and no
    update writes the state's second copy into backups/ (update_env)."""
    for key, value in world.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PULUMI_SKIP_CHECKPOINTS", raising=False)
    monkeypatch.delenv("PULUMI_DIY_BACKEND_DISABLE_CHECKPOINT_BACKUPS", raising=False)
    command = _Recording()
    stack = AutomationStack(world.stack.directory, world.name, command=command)
    deployed = stack.read()
    home1 = proxy_urn(STACK, PROJECT, "home-1")
    exported = world.stack.resources()
    assert [
        (r.urn, r.type, r.parent, r.created and r.created.isoformat()) for r in deployed.resources
    ] == [
        (
            r["urn"],
            r["type"],
            r.get("parent"),
            r.get("created") and datetime.fromisoformat(r["created"]).isoformat(),
        )
        for r in exported
    ]
    assert home1 in {r.urn for r in deployed.resources}
    history = world.history()
    state = world.stack.directory / "state" / ".pulumi"
    backups = sorted((state / "backups").rglob("*.json"))
    copies = sorted((state / "history").rglob("*.checkpoint.json"))
    # A targeted update that changes nothing: home-1 registered as it is.
    updated = stack.update("autopilot: test, no change", [home1], ["home-1"], checkpoints=False)
    assert updated.id == len(history) + 1 == len(world.history())
    [up_env] = [env for args, env in zip(command.seen, command.envs, strict=True) if "up" in args]
    assert up_env.get("PULUMI_SKIP_CHECKPOINTS") == "true", up_env
    # The history keeps the update's copy of the state; no second one in backups/.
    assert up_env.get("PULUMI_DIY_BACKEND_DISABLE_CHECKPOINT_BACKUPS") == "true", up_env
    assert len(sorted((state / "history").rglob("*.checkpoint.json"))) == len(copies) + 1
    assert sorted((state / "backups").rglob("*.json")) == backups
    reads = [args[:2] for args in command.seen if args[0] != "version"]
    # No export, and no history read beyond the update's own entry.
    assert ["stack", "export"] not in reads and ["stack", "output"] not in reads, command.seen
    assert [a for a in command.seen if "history" in a and "--page-size" not in a] == []
    # (the read: the partial run's StackReference to the stack itself)
    assert set(updated.changes) == {"same", "read"}, updated.changes
    assert command.seen, "no command went through the stack's runner"
    revealing = [args for args in command.seen if any("show-secrets" in a for a in args)]
    assert revealing == [], revealing
    assert not [args for args in command.seen if args[:2] == ["stack", "output"]], command.seen


@pytest.mark.step
def test_a_partial_run_outside_the_autopilot_is_refused_and_changes_nothing(world: World) -> None:
    """$EGRESS_PROXIES_PARTIAL left in a shell names a ticket that is gone:
    the program refuses, rather than registering nothing and letting an
    untargeted update delete every proxy."""
    before = world.stack.export()
    stale = world.stack.directory / "gone" / "ticket.json"
    kept = world.stack.extra_env
    world.stack.extra_env = {**kept, "EGRESS_PROXIES_PARTIAL": str(stale)}
    try:
        done = world.stack.run("up", "--yes", "--skip-preview")
    finally:
        world.stack.extra_env = kept
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert f"$EGRESS_PROXIES_PARTIAL: names '{stale}', which does not exist" in text, text
    assert "Traceback" not in text
    after = world.stack.export()
    assert [r["urn"] for r in after["deployment"]["resources"]] == [
        r["urn"] for r in before["deployment"]["resources"]
    ]


@pytest.mark.step
def test_a_manual_update_holding_the_lock_is_waited_for_then_the_change_goes_on(
    world: World,
) -> None:
    # The next change the autopilot makes: bring home up towards its new min.
    # (Demand's rules through the CLI: tests/engine/test_cli_autopilot_demand.py.)
    policy = json.loads(json.dumps(POLICY))
    policy["scale"]["groups"]["home"] = {"min": 4, "max": 4}
    world.stack.write_config({**world.config(), "autopilot": policy})
    locks = world.stack.directory / "state" / ".pulumi" / "locks"
    manual = world.stack.start("up", "--yes", "--skip-preview")
    try:
        wait_for(lambda: any(locks.rglob("*.json")), timeout=60, what="the manual update's lock")
        freeze_run(manual)  # it holds the lock, doing nothing
        pilot = world.start("--once")
        waited = []
        for line in pilot.stdout or []:
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "wait":
                waited.append(event)
                break
        assert waited and f"(pid {manual.pid})" in waited[0]["holder"], waited
        assert pilot.poll() is None  # still waiting, never cancelling the other
        _thaw(manual)
        assert manual.wait(timeout=300) == 0
        rest, _ = pilot.communicate(timeout=600)
    finally:
        _thaw(manual)
        manual.wait(timeout=300)
    assert pilot.returncode == 0, rest
    lines = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    [change] = [d for d in lines if d["event"] == "change"]
    assert change["result"] == "applied" and change["duration"] > 0
    assert world.history()[0]["message"] == change["message"]
    assert world.history()[1]["kind"] == "update"  # the manual one, before it


@pytest.mark.step
def test_a_failed_update_names_its_cause_and_undoes_its_edit(world: World) -> None:
    """A host that lost its volumes (an empty one in its place): the scale-up's
    creates fail on it. The decision log says why, with no secret in it, and
    the config edit is undone."""
    policy = json.loads(json.dumps(POLICY))
    policy["scale"]["groups"]["home"] = {"min": 5, "max": 5}
    world.stack.write_config({**world.config(), "autopilot": policy})
    before = world.replicas()["home"]
    history = world.history()
    host = world.hosts / "home--nas1"
    kept = host.with_name("home--nas1.kept")
    host.rename(kept)
    try:
        done = world.autopilot("--once")
    finally:
        shutil.rmtree(host, ignore_errors=True)
        kept.rename(host)
    assert done.returncode == 1, done.stdout + done.stderr
    [change] = [d for d in decisions(done) if d["event"] == "change"]
    assert change["result"] == "failed", change
    # The cause, as the kvm provider raised it, named by the resource that failed.
    assert change["error"].startswith(
        f"home-{before}-overlay: HostResourceMissing: host 'nas1' "
    ), change["error"]
    assert "is not a volume libvirt knows" in change["error"]
    # And on stderr, for an operator whose decision log goes to a file.
    assert f"autopilot: {change['message']}: failed: home-{before}-overlay: Host" in done.stderr
    assert world.replicas()["home"] == before  # the edit undone
    assert len(world.history()) == len(history) + 1  # the failed update, in the history
    passwords = [p["auth"]["password"] for p in world.publish()["proxies"] if "auth" in p]
    assert passwords and not any(pw in done.stdout + done.stderr for pw in passwords)


@pytest.mark.step
def test_a_proxy_the_service_judges_unhealthy_for_unhealthy_for_is_replaced(world: World) -> None:
    """A VM that died (a Spot VM preempted and deleted): the first round
    remembers when the service first judged it unhealthy (in the state file,
    for the next `--once`), a round past `unhealthyFor` replaces it."""
    policy = {"recycle": {"unhealthyFor": "1s", "healthyFloor": 1}, "maxChangesPerRound": 1}
    world.stack.write_config({**world.config(), "autopilot": policy})
    world.publish()
    fake = world.service.fake
    assert fake is not None and "edge-0" in fake.states
    world.service.call(lambda: fake.set("edge-0", Health.UNHEALTHY, "refused"))
    first = world.autopilot("--once")
    assert first.returncode == 0, first.stdout + first.stderr
    assert not [d for d in decisions(first) if d["event"] == "change"]
    assert list(json.loads(world.state.read_text())["unhealthySince"]) == ["edge-0"]
    time.sleep(1.5)  # real time for the real command's clock to pass unhealthyFor
    world.vanish("edge-0")  # the VM died and is gone from its host
    second = world.autopilot("--once")
    assert second.returncode == 0, second.stdout + second.stderr
    [change] = [d for d in decisions(second) if d["event"] == "change"]
    assert change["result"] == "applied", change
    assert change["rule"] == "unhealthyFor" and change["proxies"] == ["edge-0", "edge-0-g2"]
    assert change["signal"]["unhealthy"] is True
    assert world.config()["generations"]["edge-0"] == 2
    names = [p["name"] for p in world.publish()["proxies"]]
    assert "edge-0-g2" in names and "edge-0" not in names
    assert json.loads(world.state.read_text())["unhealthySince"] == {}
    update, refresh = world.history()[:2]
    assert update["message"] == change["message"]
    # Refreshed first, the proxy's own resources alone: the domain that vanished
    # left the state there (a Spot VM's delete would fail on pulumi-gcp), and
    # the update deleted one resource fewer than a banned proxy's recycle.
    assert refresh["kind"] == "refresh" and refresh["result"] == "succeeded"
    assert refresh["resourceChanges"]["delete"] == 1
    assert sum(refresh["resourceChanges"].values()) <= 5, refresh["resourceChanges"]
    assert change["resources"]["delete"] == 3


def _thaw(process: subprocess.Popen[Any]) -> None:
    for pid in [process.pid, *descendants(process.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
