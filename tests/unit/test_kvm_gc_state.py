"""Where `gc` reads the stack's state when it cannot ask the CLI: the
checkpoint of the file backend the CLI would use (`PULUMI_BACKEND_URL`, else
Pulumi.yaml's `backend.url`), by the stack's short name; never a guessed
directory. What it owns there protects those objects from removal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from providers.kvm.state import load_state, owned_objects
from proxyinfra.validation import ConfigError

PROJECT = "egress-proxies"


def _checkpoint(backend: Path, stack: str, domain: str) -> None:
    where = backend / ".pulumi" / "stacks" / PROJECT / f"{stack}.json"
    where.parent.mkdir(parents=True)
    resource = {"outputs": {"name": domain, "logicalName": "home-0"}}
    where.write_text(json.dumps({"checkpoint": {"latest": {"resources": [resource]}}}))


@pytest.fixture(autouse=True)
def _no_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no `pulumi` to ask
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)


def test_the_backend_pulumi_yaml_names_by_the_short_name(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(f"name: {PROJECT}\nbackend:\n  url: file://./state\n")
    _checkpoint(project / "state", "dev", "egress-p-0123456789")
    for stack in ("dev", f"organization/{PROJECT}/dev"):
        owned = owned_objects(load_state(project, PROJECT, stack, None))
        assert owned.names == {"egress-p-0123456789"} and owned.logical_names == {"home-0"}


def test_the_variable_s_backend_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(f"name: {PROJECT}\nbackend:\n  url: file://./state\n")
    _checkpoint(project / "state", "dev", "egress-p-from-the-project")
    _checkpoint(tmp_path / "elsewhere", "dev", "egress-p-from-the-variable")
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path / 'elsewhere'}")
    assert owned_objects(load_state(project, PROJECT, "dev", None)).names == {
        "egress-p-from-the-variable"
    }


def test_no_file_backend_named_is_an_error_not_a_guess(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(f"name: {PROJECT}\n")
    # What the old fallback read whatever the backend: a directory nobody named.
    _checkpoint(project / ".pulumi-state", "dev", "egress-p-0123456789")
    with pytest.raises(ConfigError, match="cannot read the state of stack 'dev'"):
        load_state(project, PROJECT, "dev", None)
