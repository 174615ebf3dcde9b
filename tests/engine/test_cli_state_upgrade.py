"""A stack made by an earlier release, upgraded: the program of this checkout
on a state recorded with the earlier one (tests/support/upgrade_state.py,
tests/golden/state/), through the real CLI. The kvm resources changed the
form of what they keep in state (docs/kvm-provider.md, "State per proxy"),
and nothing of a running proxy may be replaced for that: the first preview
expects no change, the first up changes nothing, keeps every URN and id and
writes the seed's inputs in the new form, against which nothing changes
either, and a document changed afterwards is still seen against the old
form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from providers.kvm.seeddocs import DOCUMENTS, PACKED
from tests.support.pulumi_cli import ROOT, CliStack
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import set_kvm
from tests.support.upgrade_state import STACK, config, image_url, load

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

GOLDEN = ROOT / "tests" / "golden" / "state"
# Recorded at release c9adc8f: the seed's outputs repeat its documents; at
# commit fa889d8: the seed's documents unpacked in its inputs, a digest of
# each in its outputs, the proxy's manifest entry in its component's outputs.
RECORDED = ("kvm_proxy_c9adc8f.json", "kvm_proxy_fa889d8.json")


def _ids(stack: CliStack) -> dict[str, str | None]:
    return {r["urn"]: r.get("id") for r in stack.resources()}


def _imported(where: Path, golden: str) -> tuple[CliStack, dict[str, str | None]]:
    state = load(GOLDEN / golden, where)
    stack = CliStack(
        where / "stack", STACK, config(where, image_url(state)), simulated_env(where / "hosts")
    )
    file = where / "recorded.json"
    file.write_text(json.dumps(state))
    stack.ok("stack", "import", "--file", str(file))
    recorded = {r["urn"]: r.get("id") for r in state["deployment"]["resources"]}
    return stack, recorded


def _seed(stack: CliStack) -> dict[str, Any]:
    return next(r for r in stack.resources() if r["urn"].endswith("::p0-0-seed"))


@pytest.mark.parametrize("golden", RECORDED)
def test_a_stack_of_an_earlier_release_upgrades_with_no_change(tmp_path: Path, golden: str) -> None:
    stack, recorded = _imported(tmp_path, golden)
    assert len(recorded) >= 6 and _ids(stack) == recorded
    stack.ok("preview", "--expect-no-changes")
    stack.ok("up", "--yes", "--skip-preview", "--expect-no-changes")
    assert _ids(stack) == recorded
    # The seed's inputs are now the new form (its outputs stay the earlier
    # one until a refresh: tests/unit/test_kvm_seed_state.py), and nothing
    # changes against them.
    seed = _seed(stack)
    assert PACKED in seed["inputs"] and not set(DOCUMENTS) & set(seed["inputs"])
    assert "ciphertext" in seed["inputs"][PACKED]
    stack.ok("preview", "--expect-no-changes")
    assert _ids(stack) == recorded


@pytest.mark.parametrize("golden", RECORDED)
def test_a_document_changed_after_the_upgrade_rewrites_the_seed_and_replaces_the_domain(
    tmp_path: Path, golden: str
) -> None:
    """The seed's diff against outputs of an earlier form (the documents, or
    a digest of each, kept in them) still sees a new document: the seed is
    rewritten in place, and the domain, whose state holds no digests of the
    seed's parts (providers/kvm/squidfiles.py), is replaced as then."""
    stack, _ = _imported(tmp_path, golden)
    changed = config(tmp_path, image_url(load(GOLDEN / golden, tmp_path)))
    set_kvm(changed["providers"][0], vendor_data="#!/bin/sh\necho changed\n")
    stack.write_config(changed)
    preview = json.loads(stack.ok("preview", "--json").stdout)
    ops = {step["urn"].rsplit("::", 1)[1]: step["op"] for step in preview["steps"]}
    assert ops["p0-0-seed"] == "update" and ops["p0-0-domain"] == "replace", ops
    assert ops.get("p0-0-overlay", "same") == "same", ops
