"""Generations through the real CLI on a simulated kvm host, as an operator
(or the autopilot) recycles a proxy: ordered steps on one stack, group
`home` of 2 replicas.

The stack is made by the program as it was before generations existed (the
commit BEFORE, extracted with `git archive`, program and providers both), so
the first step proves that upgrading changes nothing: `preview
--expect-no-changes` with this checkout's program. Then `pulumi config set
--path egress-proxies:generations.home-0 2` and `up`: the old domain and its
volumes leave the host, a new domain with another MAC (so another DHCP
lease) comes, the manifest names `home-0-g2`, and `home-1` is untouched.

BEFORE is the last commit before generations. A later change that must
alter the resources of existing stacks fails the first step as well (an
upgrade that churns is worth seeing, and its upgrade note says so); BEFORE
then moves to that change's parent, the config still without generations,
which is what the step is about.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from providers.kvm.simulated import SimulatedHost
from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.names import proxy_id
from tests.support.baseimages import random_qcow2, serve
from tests.support.http import FileServer
from tests.support.pulumi_cli import PROJECT, ROOT, CliStack
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import (
    host,
    image,
    key_files,
    kvm_provider,
    placement,
    proxy,
    squid,
    stack_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]
# The last commit whose program knew no generations (its stacks are the ones to keep).
BEFORE = "aa7244b556ed27ddb835d40416134f2178d05939"
STACK = "gen"
KINDS = ("credentials", "overlay", "seed", "domain")  # a kvm replica's resources


def pid(name: str) -> str:
    return proxy_id(PROJECT, STACK, name)


@dataclass
class World:
    stack: CliStack
    hosts: Path
    seen: dict[str, Any]  # what a step recorded for the next

    def host(self) -> SimulatedHost:
        """The host as a provider process finds it (closed by the caller)."""
        return SimulatedHost(self.hosts / "home--nas0", pool="default", network="n")

    def domains(self) -> dict[str, tuple[str, str, int]]:
        """Domain name -> (UUID, MAC, run state)."""
        host = self.host()
        try:
            found = {}
            for dom in host.raw.listAllDomains(0):
                mac = ET.fromstring(dom.XMLDesc(0)).find("devices/interface/mac")
                assert mac is not None
                found[dom.name()] = (dom.UUIDString(), mac.attrib["address"], dom.state()[0])
            return found
        finally:
            host.close()

    def volumes(self) -> set[str]:
        host = self.host()
        try:
            pool = host.raw.storagePoolLookupByName("default")
            return {v.name() for v in pool.listAllVolumes()}
        finally:
            host.close()

    def fleet(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.stack.output("fleet")["proxies"]}

    def state_of(self, replica: str) -> dict[str, tuple[Any, Any]]:
        """URN -> (id, outputs) of the replica's resources in the stack's state."""
        names = {replica} | {f"{replica}-{kind}" for kind in KINDS}
        # Secrets shown: their ciphertext changes each time the state is written.
        state = json.loads(self.stack.ok("stack", "export", "--show-secrets").stdout)
        return {
            r["urn"]: (r.get("id"), r.get("outputs"))
            for r in state["deployment"]["resources"]
            if r["urn"].split("::")[-1] in names
        }


def without_entry(state: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """STATE with its Proxy components' outputs as the program registers them now."""
    return {
        urn: (id_, {k: v for k, v in outputs.items() if k != "entry"})
        if urn.split("::")[-2] == PROXY_TYPE
        else (id_, outputs)
        for urn, (id_, outputs) in state.items()
    }


def extract(commit: str, where: Path) -> Path:
    """The program and providers of COMMIT, as a checkout of it would hold them."""
    archive = where / "before.tar"
    done = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "archive",
            "-o",
            str(archive),
            commit,
            "__main__.py",
            "proxyinfra",
            "providers",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"git archive {commit}: {done.stderr}"
    tree = where / "before"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def use_program(stack: CliStack, program: Path) -> None:
    """Point the stack's project at PROGRAM (its __main__.py and packages)."""
    project = yaml.safe_load((stack.directory / "Pulumi.yaml").read_text())
    project["main"] = os.path.relpath(program, stack.directory)
    (stack.directory / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    stack.extra_env = {**stack.extra_env, "PYTHONPATH": str(program)}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    where = tmp_path_factory.mktemp("generations")
    before = extract(BEFORE, where)
    assert not (before / "proxyinfra" / "generations.py").exists(), "BEFORE knows generations"
    with FileServer() as server:
        base = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16))
        provider = kvm_provider(
            *key_files(where),
            hosts=[host("nas0", "192.0.2.1:22")],
            images={"d": image(base.url)},
            ip_timeout=30,
        )
        home = proxy("home", "home", replicas=2, where=placement())
        config = stack_config([provider], [home], squid(username="crawler"))
        hosts = where / "hosts"
        stack = CliStack(where / "stack", STACK, config, simulated_env(hosts), program=before)
        use_program(stack, before)
        yield World(stack, hosts, {})


@pytest.mark.step
def test_a_stack_made_before_generations_has_no_change_after_them(world: World) -> None:
    world.stack.ok("up", "--yes", "--skip-preview")
    assert list(world.fleet()) == ["home-0", "home-1"]
    use_program(world.stack, ROOT)
    world.stack.ok("preview", "--expect-no-changes")
    # Generation 1 written out is the same as none.
    world.stack.ok("config", "set", "--path", f"{PROJECT}:generations.home-1", "1")
    world.stack.ok("preview", "--expect-no-changes")


@pytest.mark.step
def test_generation_2_replaces_the_replica_and_only_it(world: World) -> None:
    before_domains, before_volumes = world.domains(), world.volumes()
    before_fleet, home_1 = world.fleet(), world.state_of("home-1")
    assert set(before_domains) == {pid("home-0"), pid("home-1")}
    assert len(home_1) == 5  # the component, credentials, overlay, seed, domain
    world.stack.ok("config", "set", "--path", f"{PROJECT}:generations.home-0", "2")
    assert yaml.safe_load(world.stack.stack_file.read_text())["config"][
        f"{PROJECT}:generations"
    ] == {"home-0": 2, "home-1": 1}

    world.stack.ok("up", "--yes", "--skip-preview")

    fleet = world.fleet()
    assert list(fleet) == ["home-0-g2", "home-1"]
    assert fleet["home-0-g2"]["id"] == pid("home-0-g2")
    assert fleet["home-1"] == before_fleet["home-1"]
    # On the host: the old domain and its volumes are gone, a new domain runs
    # with a MAC of its own (a new DHCP lease), home-1's domain is the same one.
    domains = world.domains()
    assert set(domains) == {pid("home-0-g2"), pid("home-1")}
    assert domains[pid("home-1")] == before_domains[pid("home-1")]
    new_mac, old_mac = domains[pid("home-0-g2")][1], before_domains[pid("home-0")][1]
    assert new_mac != old_mac
    assert domains[pid("home-0-g2")][2] == libvirt.VIR_DOMAIN_RUNNING
    gone = {f"{pid('home-0')}.qcow2", f"{pid('home-0')}-seed.iso"}
    made = {f"{pid('home-0-g2')}.qcow2", f"{pid('home-0-g2')}-seed.iso"}
    assert gone <= before_volumes
    assert world.volumes() == (before_volumes - gone) | made
    # In the state: home-1's resources are the same resources with the same
    # outputs (neither replaced nor updated); nothing of home-0 is left. Only
    # its component's outputs lose the manifest entry the program before
    # issue 42 also registered there: the stack's `fleet` output keeps it.
    assert world.state_of("home-1") == without_entry(home_1)
    assert world.state_of("home-0") == {}
    assert len(world.state_of("home-0-g2")) == 5


@pytest.mark.step
def test_a_preview_after_the_recycle_expects_no_changes(world: World) -> None:
    world.stack.ok("preview", "--expect-no-changes")
