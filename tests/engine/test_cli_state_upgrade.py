"""A stack made by an earlier release, upgraded: the program of this checkout
on a state recorded with the earlier one (tests/support/upgrade_state.py,
tests/golden/state/), through the real CLI. The kvm resources changed the
form of what they keep in state (docs/kvm-provider.md, "State per proxy"),
and nothing of a running proxy may be replaced for that: the first preview
expects no change, the first up changes nothing and keeps every URN and id,
and a document changed afterwards is still seen against the old form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.pulumi_cli import ROOT, CliStack
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import set_kvm
from tests.support.upgrade_state import STACK, config, image_url, load

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

# Recorded at commit c9adc8f: the seed's outputs repeat its documents.
GOLDEN = ROOT / "tests" / "golden" / "state" / "kvm_proxy_c9adc8f.json"


def _ids(stack: CliStack) -> dict[str, str | None]:
    return {r["urn"]: r.get("id") for r in stack.resources()}


def _imported(where: Path) -> tuple[CliStack, dict[str, str | None]]:
    state = load(GOLDEN, where)
    stack = CliStack(
        where / "stack", STACK, config(where, image_url(state)), simulated_env(where / "hosts")
    )
    file = where / "recorded.json"
    file.write_text(json.dumps(state))
    stack.ok("stack", "import", "--file", str(file))
    recorded = {r["urn"]: r.get("id") for r in state["deployment"]["resources"]}
    return stack, recorded


def test_a_stack_of_the_earlier_release_upgrades_with_no_change(tmp_path: Path) -> None:
    stack, recorded = _imported(tmp_path)
    assert len(recorded) >= 6 and _ids(stack) == recorded
    stack.ok("preview", "--expect-no-changes")
    stack.ok("up", "--yes", "--skip-preview", "--expect-no-changes")
    assert _ids(stack) == recorded


def test_a_document_changed_after_the_upgrade_replaces_the_seed(tmp_path: Path) -> None:
    """The seed's diff against outputs of the earlier form (documents kept
    in them) still sees a new document."""
    stack, _ = _imported(tmp_path)
    changed = config(tmp_path, image_url(load(GOLDEN, tmp_path)))
    set_kvm(changed["providers"][0], vendor_data="#!/bin/sh\necho changed\n")
    stack.write_config(changed)
    preview = json.loads(stack.ok("preview", "--json").stdout)
    ops = {step["urn"].rsplit("::", 1)[1]: step["op"] for step in preview["steps"]}
    assert ops["p0-0-seed"] == "replace" and ops["p0-0-domain"] == "replace", ops
    assert ops.get("p0-0-overlay", "same") == "same", ops
