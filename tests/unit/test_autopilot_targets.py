"""What a change's update and refresh are targeted at (proxyinfra/autopilot/targets.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from proxyinfra.autopilot.changes import Recycle
from proxyinfra.autopilot.seam import DeployedResource
from proxyinfra.autopilot.targets import edit_for
from proxyinfra.validation import validate
from tests.support.autopilot_round import PROJECT, World, urn

DYNAMIC = "pulumi-python:dynamic:Resource"
PYTHON = "urn:pulumi:sim::egress-proxies::pulumi:providers:pulumi-python::default"


def test_a_recycle_for_being_down_refreshes_that_proxy_its_children_and_their_providers(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, {"recycle": {"unhealthyFor": "30m"}}, {"home": 2})
    deployed = world.stack.read()
    children = [
        DeployedResource(
            f"{urn(name)}$child::{name}-{kind}", DYNAMIC, urn(name), None, f"{PYTHON}::id1"
        )
        for name in ("home-0", "home-1")
        for kind in ("overlay", "domain")
    ]
    deployed = replace(deployed, resources=[*deployed.resources, *children])
    config = validate(deployed.config, tmp_path)
    down = Recycle("home", "home-0", "unhealthyFor", "unhealthy for 30m")
    edit = edit_for(down, config, deployed, PROJECT, "sim")
    assert edit.refresh == (
        urn("home-0"),
        f"{urn('home-0')}$child::home-0-overlay",
        f"{urn('home-0')}$child::home-0-domain",
        PYTHON,
    )
    # A proxy banned is there: its update deletes what it holds, no refresh.
    banned = edit_for(replace(down, rule="bannedSites"), config, deployed, PROJECT, "sim")
    assert banned.refresh == () and banned.targets == edit.targets
