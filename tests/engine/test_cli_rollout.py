"""A change that replaces a group's kvm proxies, through the real CLI on a
simulated host: at most ``maxUnavailable`` of them are down at once, each
one replaced after the one before it has its address again
(proxyinfra/rollout.py), a first `up` too; an existing stack sees no
change from the waits.

Read from the engine's own event log (`--event-log`): a proxy is down from
the start of its domain's delete to the end of its replacement's create."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from providers.kvm.simulated import SimulatedHost
from tests.support.baseimages import random_qcow2, serve
from tests.support.http import FileServer
from tests.support.pulumi_cli import CliStack
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import (
    host,
    image,
    key_files,
    kvm_provider,
    machine_type,
    placement,
    proxy,
    squid,
    stack_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

REPLICAS = 4


def config(
    where: Path, image_url: str, connect_ports: list[str], memory_mib: int = 512, **extra: Any
) -> dict[str, Any]:
    provider = kvm_provider(
        *key_files(where),
        hosts=[host("nas0", "192.0.2.1:22")],
        images={"d": image(image_url)},
        machine_types={"s": machine_type(1, memory_mib)},
        ip_timeout=30,
    )
    group = proxy("home", "home", replicas=REPLICAS, where=placement(zone="nas0")) | extra
    return stack_config([provider], [group], squid(connect_ports=connect_ports))


@dataclass
class Step:
    seq: int
    phase: str  # "start" or "end"
    op: str
    name: str  # the resource's name, home-0-domain


def steps(log: Path) -> list[Step]:
    """The engine's step events for the kvm resources, in sequence order."""
    found = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        for key, phase in (("resourcePreEvent", "start"), ("resOutputsEvent", "end")):
            if key in event:
                meta = event[key]["metadata"]
                name = meta["urn"].rsplit("::", 1)[-1]
                found.append(Step(event["sequence"], phase, meta["op"], name))
    return sorted(found, key=lambda s: s.seq)


def seq_of(order: list[Step], name: str, phase: str, op: str | None = None) -> int:
    """The sequence number of NAME's step event at PHASE (of OP, when given)."""
    return next(s.seq for s in order if (s.name, s.phase) == (name, phase) and op in (None, s.op))


def most_down(log: Path) -> tuple[int, list[str]]:
    """The most domains down at once, and the order in which they came back."""
    down: set[str] = set()
    most, back = 0, []
    for step in steps(log):
        if not step.name.endswith("-domain"):
            continue
        if step.op == "delete-replaced" and step.phase == "start":
            down.add(step.name)
            most = max(most, len(down))
        elif step.op == "create-replacement" and step.phase == "end":
            down.discard(step.name)
            back.append(step.name)
    return most, back


@dataclass
class Rollout:
    stack: CliStack
    where: Path
    image_url: str
    other_image_url: str

    def domains(self) -> set[str]:
        """The domains on the simulated host, as the next CLI run finds them."""
        simulated = SimulatedHost(self.where / "hosts" / "home--nas0", pool="default", network="n")
        try:
            return {d.name() for d in simulated.raw.listAllDomains(0)}
        finally:
            simulated.close()

    def up(self, name: str, connect_ports: list[str], **extra: Any) -> Path:
        self.stack.write_config(config(self.where, self.image_url, connect_ports, **extra))
        log = self.where / f"{name}.events.jsonl"
        done = self.stack.ok("up", "--yes", "--skip-preview", "--event-log", str(log))
        log.with_suffix(".out").write_text(done.stdout + done.stderr)
        return log


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rollout]:
    where = tmp_path_factory.mktemp("rollout")
    with FileServer() as server:
        url = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16)).url
        other = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16)).url
        # The CLI takes --event-log only with its debug commands on (as the
        # Automation API runs it).
        env = simulated_env(where / "hosts") | {"PULUMI_DEBUG_COMMANDS": "true"}
        stack = CliStack(where / "stack", "roll", config(where, url, ["443"]), env)
        yield Rollout(stack, where, url, other)


def test_a_first_up_creates_the_group_in_turn_too(rollout: Rollout) -> None:
    log = rollout.up("first", ["443"])
    order = steps(log)
    # The program cannot tell a new replica from one being replaced.
    for i in range(1, REPLICAS):
        made = seq_of(order, f"home-{i}-overlay", "start")
        assert made > seq_of(order, f"home-{i - 1}-domain", "end")
    assert len(rollout.stack.output("fleet")["proxies"]) == REPLICAS


def test_a_machine_type_change_replaces_one_replica_at_a_time_by_default(
    rollout: Rollout,
) -> None:
    before = [p["id"] for p in rollout.stack.output("fleet")["proxies"]]
    log = rollout.up("one-at-a-time", ["443"], memory_mib=640)
    most, back = most_down(log)
    assert len(back) == REPLICAS  # every domain was replaced: a new definition
    assert most == 1, f"{most} replicas of the group were down at once"
    assert back == [f"home-{i}-domain" for i in range(REPLICAS)]
    # The same proxies made again (their ids, and so machines and MACs).
    assert [p["id"] for p in rollout.stack.output("fleet")["proxies"]] == before


def test_max_unavailable_two_replaces_two_at_a_time(rollout: Rollout) -> None:
    log = rollout.up("two-at-a-time", ["443"], maxUnavailable=2)  # back to 512 MiB
    most, back = most_down(log)
    assert len(back) == REPLICAS
    assert most <= 2, f"{most} replicas of the group were down at once"
    # Each replica waits for the one two places before it to be back.
    order = steps(log)
    for i in range(2, REPLICAS):
        down = seq_of(order, f"home-{i}-domain", "start", "delete-replaced")
        assert down > seq_of(order, f"home-{i - 2}-domain", "end", "create-replacement")


def test_a_change_no_replica_survives_takes_down_max_unavailable_of_them(
    rollout: Rollout,
) -> None:
    """A machine type no host has room for. At 100 %, with the engine going
    on past a failed step (`--continue-on-error`), every replica's
    replacement is tried, as none waits for another: all four are taken
    down. At 2, the engine stopping at the first failure, the two that wait
    are never taken down, whichever of the first two failed first. (How many
    are down at the same moment in a roll that succeeds is the engine's
    timing, which a test cannot hold; which replica waits for which is the
    program's.)"""
    huge = 2 * 1024 * 1024  # MiB; the simulated host has 1 TiB free
    for allowed, first_wave, go_on in (("100%", REPLICAS, ["--continue-on-error"]), (2, 2, [])):
        config_ = config(rollout.where, rollout.image_url, ["443"], huge, maxUnavailable=allowed)
        rollout.stack.write_config(config_)
        log = rollout.where / f"none-fit-{first_wave}.events.jsonl"
        done = rollout.stack.run("up", "--yes", "--skip-preview", *go_on, "--event-log", str(log))
        assert done.returncode != 0
        assert "of memory free" in done.stdout
        deleted = {s.name for s in steps(log) if s.op == "delete-replaced" and s.phase == "start"}
        wave = {f"home-{i}-domain" for i in range(first_wave)}
        if go_on:
            assert deleted == wave
        else:
            assert deleted and deleted <= wave
        assert len(rollout.domains()) == REPLICAS - len(deleted)
        rollout.up(f"fits-after-{first_wave}", ["443"], memory_mib=640)
        assert len(rollout.domains()) == REPLICAS


def test_an_image_change_replaces_one_replica_at_a_time(rollout: Rollout) -> None:
    rollout.image_url = rollout.other_image_url  # a new base: every overlay replaced
    log = rollout.up("new-image", ["443"], memory_mib=640, maxUnavailable=1)
    most, back = most_down(log)
    assert len(back) == REPLICAS
    assert most == 1, f"{most} replicas of the group were down at once"
    replaced = {s.name for s in steps(log) if s.op == "create-replacement"}
    assert {f"home-{i}-overlay" for i in range(REPLICAS)} <= replaced


def test_a_replacement_that_fails_stops_the_roll(rollout: Rollout) -> None:
    """A machine type no host has room for (the simulated host has 1 TiB
    free): the first replica's new domain is refused, and the rest of the
    group is never taken down; all at once, the whole group would be gone."""
    ids = {p["name"]: p["id"] for p in rollout.stack.output("fleet")["proxies"]}
    huge = 2 * 1024 * 1024  # MiB
    rollout.stack.write_config(config(rollout.where, rollout.image_url, ["443"], memory_mib=huge))
    log = rollout.where / "too-big.events.jsonl"
    done = rollout.stack.run("up", "--yes", "--skip-preview", "--event-log", str(log))
    assert done.returncode != 0
    assert "of memory free" in done.stdout
    deleted = {s.name for s in steps(log) if s.op == "delete-replaced" and s.phase == "start"}
    assert deleted == {"home-0-domain"}
    assert rollout.domains() == {ids[f"home-{i}"] for i in range(1, REPLICAS)}
    # Back to a machine type that fits: home-0 is made again.
    rollout.up("fits-again", ["443"], maxUnavailable=1)
    assert rollout.domains() == set(ids.values())


def most_updating(log: Path) -> tuple[int, list[str]]:
    """The most domains in an update at once, and the order their updates ended."""
    busy: set[str] = set()
    most, done = 0, []
    for step in steps(log):
        if step.name.endswith("-domain") and step.op == "update":
            if step.phase == "start":
                busy.add(step.name)
                most = max(most, len(busy))
            else:
                busy.discard(step.name)
                done.append(step.name)
    return most, done


def test_a_squid_change_is_an_update_in_place_one_replica_at_a_time(rollout: Rollout) -> None:
    """New squid settings are not a new machine: the seed is rewritten and the
    running domain updated (a simulated guest has no agent, so the provider
    restarts it, whose boot applies the seed), in turn like a replacement."""
    rollout.stack.write_config(config(rollout.where, rollout.image_url, ["443", "8443"]))
    preview = rollout.stack.ok("preview", "--diff")
    assert "home-0-domain" in preview.stdout
    assert "replace" not in preview.stdout, preview.stdout
    log = rollout.up("squid", ["443", "8443"])
    ops = {(s.name, s.op) for s in steps(log)}
    assert not any(op in ("delete-replaced", "create-replacement") for _name, op in ops)
    assert {(f"home-{i}-seed", "update") for i in range(REPLICAS)} <= ops
    most, done = most_updating(log)
    assert done == [f"home-{i}-domain" for i in range(REPLICAS)]
    assert most == 1, f"{most} domains were updated at once"
    assert "the guest agent did not answer" in log.with_suffix(".out").read_text()
    assert rollout.stack.run("preview", "--expect-no-changes").returncode == 0


def test_the_waits_change_nothing_on_an_existing_stack(rollout: Rollout) -> None:
    rollout.stack.write_config(
        config(rollout.where, rollout.image_url, ["443", "8443"], maxUnavailable=1)
    )
    rollout.stack.ok("preview", "--expect-no-changes")
    rollout.stack.ok("destroy", "--yes", "--skip-preview")


def test_a_targeted_up_makes_a_new_group_s_second_replica_alone(rollout: Rollout) -> None:
    """`up --target` of home-1 on an empty stack: home-0, left out, resolves
    with no address, and home-1's wait takes that as its turn (a failed
    predecessor under `--continue-on-error` looks the same to the program,
    docs/kvm-provider.md)."""
    rollout.stack.write_config(config(rollout.where, rollout.image_url, ["443"]))
    preview = json.loads(rollout.stack.ok("preview", "--json").stdout)
    wanted = [
        step["urn"]
        for step in preview["steps"]
        if "home-1" in step["urn"] or "-image-" in step["urn"]
    ]
    targets = [arg for urn in wanted for arg in ("--target", urn)]
    rollout.stack.ok("up", "--yes", "--skip-preview", *targets)
    names = {r["urn"].rsplit("::", 1)[-1] for r in rollout.stack.resources()}
    assert "home-1-domain" in names
    assert "home-0-overlay" not in names and "home-0-domain" not in names
    assert len(rollout.domains()) == 1
    rollout.stack.ok("destroy", "--yes", "--skip-preview")
