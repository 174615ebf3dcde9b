"""How GCP provisions a proxy's VM (`gcp.provisioning`, providers/gcp/scheduling.py),
under Pulumi's mocks: Spot VMs with what GCP requires of them and deleted when
preempted, standard said explicitly (how a group leaves Spot), and no block at
all without the key, so that stacks made before it see no change."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.program import ProgramResult, run_program
from tests.support.mock_clouds import HOOK, INSTANCE
from tests.support.stack_config import gcp_provider, placement, proxy, squid, stack_config

PROGRAM = "proxyinfra.program:main"


def entry(name: str, provisioning: str | None) -> dict[str, Any]:
    provider = gcp_provider(name)
    if provisioning is not None:
        provider["gcp"]["provisioning"] = provisioning
    return provider


@pytest.fixture(scope="module")
def fleet() -> ProgramResult:
    where = placement("e2-small", "debian", zone="europe-west1-b")
    config = stack_config(
        [entry("gcp-spot", "spot"), entry("gcp-standard", "standard"), entry("gcp-eu", None)],
        [
            proxy("cheap", "gcp-spot", replicas=2, where=where),
            proxy("steady", "gcp-standard", where=where),
            proxy("eu", "gcp-eu", where=where),
        ],
        squid(username="crawler"),
    )
    return run_program(PROGRAM, config, new_resource_hook=HOOK).raise_for_error()


def scheduling_of(fleet: ProgramResult, replica: str) -> Any:
    return fleet.resource(f"{replica}-instance", INSTANCE).inputs.get("scheduling")


def test_spot_vms_are_deleted_when_preempted(fleet: ProgramResult) -> None:
    spot = {
        "provisioningModel": "SPOT",
        "preemptible": True,
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
        "instanceTerminationAction": "DELETE",
    }
    assert scheduling_of(fleet, "cheap-0") == spot
    assert scheduling_of(fleet, "cheap-1") == spot


def test_standard_is_said_explicitly_and_no_key_leaves_no_block(fleet: ProgramResult) -> None:
    assert scheduling_of(fleet, "steady-0") == {
        "provisioningModel": "STANDARD",
        "preemptible": False,
    }
    assert "scheduling" not in fleet.resource("eu-0-instance", INSTANCE).inputs
