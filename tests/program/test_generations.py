"""Generations under Pulumi mocks: the stack program run with and without
`egress-proxies:generations`, compared. A new generation is a new name, so
new resources (the engine creates them and deletes the old ones), a new
proxy id, a kvm MAC of its own, a new gcp instance and external address;
kubernetes only where the operator says pods egress on their own address.

The clouds are mocked by tests/support/mock_clouds.py (addresses by
resource name, as a cloud gives each new resource its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from providers.kvm.domain import mac_for
from proxyinfra.names import proxy_id
from tests.harness.program import ProgramResult, run_program
from tests.support.mock_clouds import ADDRESS, DEBIAN, DYNAMIC, HOOK, INSTANCE
from tests.support.stack_config import placement, proxy, squid, stack_config
from tests.support.stack_config import unreachable_kvm_provider as kvm

PROGRAM = "proxyinfra.program:main"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


def pid(name: str) -> str:
    return proxy_id("egress-proxies", "dev", name)


def run(config: dict[str, Any], generations: dict[str, int] | None = None) -> ProgramResult:
    if generations is not None:
        config = {**config, "generations": generations}
    return run_program(PROGRAM, config, new_resource_hook=HOOK).raise_for_error()


def entries(result: ProgramResult) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in result.output("fleet")["proxies"]}


def owned(result: ProgramResult, replica: str) -> dict[str, dict[str, Any]]:
    """Every resource below the replica's Proxy component: name -> inputs."""
    top = result.resource(replica, "egress-proxies:fleet:Proxy")
    return {r.name: r.inputs for r in result.resources if r.parent == top.urn}


# -- kvm -------------------------------------------------------------------------------------


def kvm_config(directory: Path) -> dict[str, Any]:
    home = proxy("home", "home", replicas=2, where=placement())
    return stack_config([kvm(directory)], [home], squid(username="crawler"))


@pytest.fixture(scope="module")
def kvm_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProgramResult, ProgramResult]:
    config = kvm_config(tmp_path_factory.mktemp("keys"))
    return run(config), run(config, {"home-0": 2})


def test_kvm_generation_2_is_new_resources_under_a_new_name(
    kvm_runs: tuple[ProgramResult, ProgramResult],
) -> None:
    before, after = kvm_runs
    kinds = ("credentials", "overlay", "seed", "domain")
    assert sorted(owned(before, "home-0")) == sorted(f"home-0-{k}" for k in kinds)
    assert sorted(owned(after, "home-0-g2")) == sorted(f"home-0-g2-{k}" for k in kinds)
    assert "home-0" not in after.names()  # nothing of generation 1 is declared any more
    # The other replica is declared as before: the engine leaves it alone. (Its
    # seed, and the domain's digest of squid's files, differ between two runs
    # under mocks only by the password made anew.)
    for kind in ("overlay", "domain"):
        again, first = (
            {k: v for k, v in owned(run, "home-1")[f"home-1-{kind}"].items() if k != "seedParts"}
            for run in (after, before)
        )
        assert again == first
    assert sorted(owned(after, "home-1")) == sorted(owned(before, "home-1"))


def test_kvm_generation_2_has_a_new_id_mac_and_volumes(
    kvm_runs: tuple[ProgramResult, ProgramResult],
) -> None:
    before, after = kvm_runs
    old = owned(before, "home-0")["home-0-domain"]
    new = owned(after, "home-0-g2")["home-0-g2-domain"]
    assert (old["name"], new["name"]) == (pid("home-0"), pid("home-0-g2"))
    assert new["logicalName"] == "home-0-g2"
    # The MAC is the domain's id's (ProxyDomain asks DHCP with it): a new lease.
    assert mac_for(new["name"]) != mac_for(old["name"])
    volumes = owned(after, "home-0-g2")
    assert volumes["home-0-g2-overlay"]["name"] == f"{pid('home-0-g2')}.qcow2"
    assert volumes["home-0-g2-seed"]["name"] == f"{pid('home-0-g2')}-seed.iso"


def test_kvm_generation_2_is_in_the_manifest_by_its_new_name(
    kvm_runs: tuple[ProgramResult, ProgramResult],
) -> None:
    before, after = kvm_runs
    assert list(entries(before)) == ["home-0", "home-1"]
    assert list(entries(after)) == ["home-0-g2", "home-1"]
    new = entries(after)["home-0-g2"]
    assert new["id"] == pid("home-0-g2")
    assert new["host"] != entries(before)["home-0"]["host"]
    assert entries(after)["home-1"] == entries(before)["home-1"]


# -- gcp -------------------------------------------------------------------------------------


def gcp_config(static_ip: bool) -> dict[str, Any]:
    provider = {
        "name": "gcp-eu",
        "type": "gcp",
        "gcp": {
            "project": "crawl-proj-1",
            "region": "europe-west1",
            "zones": ["europe-west1-b", "europe-west1-c"],
            "machineTypes": ["e2-small"],
            "images": {"debian": DEBIAN},
            "staticIp": static_ip,
        },
    }
    eu = proxy("eu", "gcp-eu", replicas=2, where=placement("e2-small", "debian"))
    return stack_config([provider], [eu])


@pytest.mark.parametrize("static_ip", [False, True], ids=["ephemeral", "static"])
def test_gcp_generation_2_is_a_new_instance_with_a_new_external_address(static_ip: bool) -> None:
    before = run(gcp_config(static_ip))
    after = run(gcp_config(static_ip), {"eu-1": 2})
    old = before.resource("eu-1-instance", INSTANCE)
    new = after.resource("eu-1-g2-instance", INSTANCE)
    assert (old.inputs["name"], new.inputs["name"]) == (pid("eu-1"), pid("eu-1-g2"))
    assert "eu-1-instance" not in after.names()
    # Same slot, same zone: the ordinal places it, not the generation.
    assert new.inputs["zone"] == old.inputs["zone"] == "europe-west1-c"
    if static_ip:  # a new reserved address too, made while the old one is still held
        assert after.resource("eu-1-g2-address", ADDRESS).inputs["name"] == pid("eu-1-g2")
        assert "eu-1-address" not in after.names()
    assert list(entries(after)) == ["eu-0", "eu-1-g2"]
    assert entries(after)["eu-1-g2"]["host"] != entries(before)["eu-1"]["host"]
    assert entries(after)["eu-0"] == entries(before)["eu-0"]


# -- kubernetes ------------------------------------------------------------------------------


def kubernetes_config(egress_per_pod: list[str] | None) -> dict[str, Any]:
    cluster = {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress"}}
    config = stack_config([cluster], [proxy("pods", "cluster", replicas=2)])
    config["generations"] = {"pods-0": 2}
    if egress_per_pod is not None:
        config["autopilot"] = {"recycle": {"maxAge": "7d", "egressPerPod": egress_per_pod}}
    return config


def test_kubernetes_generations_are_refused_by_default_before_any_resource() -> None:
    result = run_program(PROGRAM, kubernetes_config(None), new_resource_hook=HOOK)
    assert result.error is not None
    assert result.error.message.splitlines() == [
        "invalid stack config (1 error):",
        "  generations.pods-0: 'pods-0' is a kubernetes proxy (provider 'cluster'): a new pod "
        "leaves through its node's address, so a new generation gives no new address; list "
        "'cluster' in autopilot.recycle.egressPerPod only if this cluster gives each pod its "
        "own egress address",
    ]
    assert result.resources == []


def test_kubernetes_generations_are_taken_where_each_pod_egresses_on_its_own() -> None:
    result = run_program(PROGRAM, kubernetes_config(["cluster"]), new_resource_hook=HOOK)
    result.raise_for_error()
    deployments = {
        r.name: r.inputs["metadata"]["name"] for r in result.resources_of_type(DEPLOYMENT)
    }
    assert deployments == {
        "pods-0-g2-deployment": pid("pods-0-g2"),
        "pods-1-deployment": pid("pods-1"),
    }
    assert list(entries(result)) == ["pods-0-g2", "pods-1"]


def test_no_dynamic_resource_is_left_named_for_generation_1(
    kvm_runs: tuple[ProgramResult, ProgramResult],
) -> None:
    _, after = kvm_runs
    names = [r.name for r in after.resources_of_type(DYNAMIC) if "-image-" not in r.name]
    assert sorted(names) == sorted(
        f"{replica}-{kind}"
        for replica in ("home-0-g2", "home-1")
        for kind in ("credentials", "overlay", "seed", "domain")
    )
