"""The autopilot's reads of a file backend's own files (statefile.py): the
checkpoint's resources, plain or gzip-compressed, and the number of history
entries; anything it cannot read answers None, so that the CLI is asked.
Beside them, the environment the autopilot gives its updates.
(The same reads against the real CLI's files: tests/engine/test_cli_autopilot.py.)"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from proxyinfra.autopilot.automation import update_env
from proxyinfra.autopilot.statefile import checkpoint_resources, stack_names, update_count

RESOURCES = [
    {"urn": "urn:pulumi:dev::egress-proxies::pulumi:pulumi:Stack::egress-proxies-dev"},
    {
        "urn": "urn:pulumi:dev::egress-proxies::egress:fleet:Proxy::home-0",
        "type": "egress:fleet:Proxy",
    },
]


def _stacks(root: Path) -> Path:
    where = root / ".pulumi" / "stacks" / "egress-proxies"
    where.mkdir(parents=True)
    return where


def _checkpoint(resources: list[dict[str, str]]) -> bytes:
    document = {"version": 3, "checkpoint": {"stack": "dev", "latest": {"resources": resources}}}
    return json.dumps(document).encode()


def test_the_resources_of_a_plain_and_of_a_compressed_checkpoint(tmp_path: Path) -> None:
    (_stacks(tmp_path / "plain") / "dev.json").write_bytes(_checkpoint(RESOURCES))
    (_stacks(tmp_path / "gz") / "dev.json.gz").write_bytes(gzip.compress(_checkpoint(RESOURCES)))
    assert checkpoint_resources(tmp_path / "plain", "egress-proxies", "dev") == RESOURCES
    assert checkpoint_resources(tmp_path / "gz", "egress-proxies", "dev") == RESOURCES


def test_a_stack_never_updated_has_no_resources(tmp_path: Path) -> None:
    document = {"version": 3, "checkpoint": {"stack": "dev"}}
    (_stacks(tmp_path) / "dev.json").write_text(json.dumps(document))
    assert checkpoint_resources(tmp_path, "egress-proxies", "dev") == []


def test_what_cannot_be_read_here_is_left_to_the_cli(tmp_path: Path) -> None:
    stacks = _stacks(tmp_path)
    assert checkpoint_resources(tmp_path, "egress-proxies", "dev") is None  # no file
    (stacks / "dev.json.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    assert checkpoint_resources(tmp_path, "egress-proxies", "dev") is None  # zstd
    (stacks / "dev.json").write_text('{"version": 3, "checkpoint": ')  # cut short
    assert checkpoint_resources(tmp_path, "egress-proxies", "dev") is None
    (stacks / "dev.json").write_text("[]")
    assert checkpoint_resources(tmp_path, "egress-proxies", "dev") is None


def test_updates_are_counted_by_their_history_entries_alone(tmp_path: Path) -> None:
    assert update_count(tmp_path, "egress-proxies", "dev") is None
    history = tmp_path / ".pulumi" / "history" / "egress-proxies" / "dev"
    history.mkdir(parents=True)
    for n in (1, 2, 3):
        (history / f"dev-{n}.history.json").write_text("{}")
        (history / f"dev-{n}.checkpoint.json").write_text("{}")
        (history / f"dev-{n}.history.json.attrs").write_text("{}")
    (history / "dev-4.history.json.gz").write_bytes(gzip.compress(b"{}"))
    assert update_count(tmp_path, "egress-proxies", "dev") == 4


def test_an_operator_s_own_checkpoint_setting_wins_either_way() -> None:
    skip, no_backups = "PULUMI_SKIP_CHECKPOINTS", "PULUMI_DIY_BACKEND_DISABLE_CHECKPOINT_BACKUPS"
    assert update_env(False, {}) == {skip: "true", no_backups: "true"}
    assert update_env(True, {}) == {no_backups: "true"}
    # The operator's values are in the environment the CLI inherits: nothing added.
    assert update_env(False, {skip: "false"}) == {no_backups: "true"}
    assert update_env(True, {skip: "true", no_backups: "false"}) == {}


def test_stack_names_are_the_checkpoints_of_a_layout_read_here(tmp_path: Path) -> None:
    stacks = tmp_path / ".pulumi" / "stacks" / "egress-proxies"
    stacks.mkdir(parents=True)
    for name in ("dev.json", "dev.json.attrs", "dev.json.bak", "prod.json.gz", "notes.txt"):
        (stacks / name).write_text("")
    assert stack_names(tmp_path, "egress-proxies") is None  # no meta.yaml: not this layout
    (tmp_path / ".pulumi" / "meta.yaml").write_text("version: 0\n")
    assert stack_names(tmp_path, "egress-proxies") is None  # the legacy, unscoped layout
    (tmp_path / ".pulumi" / "meta.yaml").write_text("version: 1\n")
    assert stack_names(tmp_path, "egress-proxies") == ["dev", "prod"]
    assert stack_names(tmp_path, "other") == []
