"""Simulated hosts through the real CLI (providers.kvm.simulated): `pulumi up`,
a no-change `preview`, drift seen by `refresh` and repaired by `up`, and
`destroy`, each a process of its own that finds the hosts as the last left
them; and the recovery from the empty `<stack>.json.attrs` a killed run can
leave. This is what bench/stack_scale runs at 400 proxies."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt
import pytest

from providers.kvm.simulated import SIMULATED_HOSTS_ENV, SimulatedHost
from tests.support.baseimages import random_qcow2, serve
from tests.support.http import FileServer
from tests.support.pulumi_cli import CliStack
from tests.support.simulated_fleet import fleet_config, simulated_env

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]


@dataclass
class Simulated:
    stack: CliStack
    hosts: Path

    def host(self, name: str) -> SimulatedHost:
        """A host as a provider process finds it (close it before the next CLI run)."""
        return SimulatedHost(self.hosts / f"home--{name}", pool="default", network="n")

    def domains(self) -> dict[str, int]:
        """Every simulated domain (all hosts) and its run state."""
        states: dict[str, int] = {}
        for name in ("nas0", "nas1"):
            host = self.host(name)
            states |= {d.name(): d.state()[0] for d in host.raw.listAllDomains(0)}
            host.close()
        return states


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulated]:
    where = tmp_path_factory.mktemp("simulated")
    with FileServer() as server:
        image = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16))
        config = fleet_config(3, 2, where, image.url)
        yield Simulated(
            CliStack(where / "stack", "sim", config, simulated_env(where / "hosts")),
            where / "hosts",
        )


def test_up_creates_every_proxy_on_the_simulated_hosts(simulated: Simulated) -> None:
    done = simulated.stack.ok("up", "--yes", "--skip-preview")
    assert f"{SIMULATED_HOSTS_ENV}=" in done.stdout + done.stderr
    assert "every kvm host is simulated" in done.stdout + done.stderr
    fleet = simulated.stack.output("fleet")
    assert sorted(p["name"] for p in fleet["proxies"]) == ["p0-0", "p1-0", "p2-0"]
    ids = {p["id"] for p in fleet["proxies"]}
    assert simulated.domains() == dict.fromkeys(ids, libvirt.VIR_DOMAIN_RUNNING)


def test_a_preview_after_up_expects_no_changes(simulated: Simulated) -> None:
    simulated.stack.ok("preview", "--expect-no-changes")
    simulated.stack.ok("refresh", "--yes", "--expect-no-changes")


def test_refresh_sees_a_domain_stopped_out_of_band_and_up_starts_it(
    simulated: Simulated,
) -> None:
    host = simulated.host("nas1")
    [dom] = host.libvirt().listAllDomains(0)
    dom.destroy()
    host.close()
    drift = simulated.stack.run("refresh", "--yes", "--expect-no-changes")
    assert drift.returncode != 0, drift.stdout
    simulated.stack.ok("up", "--yes", "--skip-preview")
    assert set(simulated.domains().values()) == {libvirt.VIR_DOMAIN_RUNNING}


def test_an_empty_attrs_file_left_by_a_killed_run_fails_every_command_until_removed(
    simulated: Simulated,
) -> None:
    """The file backend rewrites `<stack>.json.attrs` in place (truncate,
    then write): a run killed in between leaves it empty, as truncated here.
    Every command then fails, `pulumi cancel` included, until the documented
    recovery (docs/kvm-provider.md, "When a run is interrupted") removes it
    as scripts/up does; the checkpoint itself is intact."""
    stack = simulated.stack
    attrs = stack.attrs_file
    assert attrs.stat().st_size > 0
    attrs.write_bytes(b"")
    for args in (("cancel", "--yes"), ("preview",)):
        failed = stack.run(*args)
        assert failed.returncode != 0, failed.stdout
        assert "failed to load checkpoint: EOF" in failed.stdout + failed.stderr, args
    stack.forget_killed_run()  # its first step removes the empty file, with a warning
    assert not attrs.exists()
    stack.ok("preview", "--expect-no-changes")
    # Any empty sidecar under .pulumi/stacks/ goes, with a warning naming it;
    # a non-empty one and a missing one are left as they are.
    backup = attrs.with_name(f"{stack.stack}.json.bak.attrs")
    assert backup.stat().st_size > 0
    attrs.write_bytes(b"")
    warnings = stack.drop_empty_attrs()
    assert f"removing {attrs}: empty" in warnings and "failed to load checkpoint: EOF" in warnings
    assert not attrs.exists() and backup.stat().st_size > 0
    assert stack.drop_empty_attrs() == ""
    stack.ok("up", "--yes", "--skip-preview", "--expect-no-changes")
    assert attrs.stat().st_size > 0  # written again by the backend


def test_destroy_leaves_no_domain_and_no_proxy_volume(simulated: Simulated) -> None:
    simulated.stack.ok("destroy", "--yes", "--skip-preview")
    assert simulated.domains() == {}
    for name in ("nas0", "nas1"):
        host = simulated.host(name)
        volumes = [v.name() for v in host.raw.storagePoolLookupByName("default").listAllVolumes()]
        host.close()
        # Only the base image stays, cached for the next proxy (`gc --bases` removes it).
        assert volumes and all(v.startswith("egress-base-") for v in volumes), volumes
