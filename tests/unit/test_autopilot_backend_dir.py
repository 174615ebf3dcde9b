"""Which file backend the autopilot reads (checkpoint, locks, history) and
keeps its round state beside: the one the CLI uses, `PULUMI_BACKEND_URL`
first, else the project's `backend.url` in Pulumi.yaml, a relative path from
the project directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyinfra.autopilot.memory import default_path
from proxyinfra.stackfile import backend_dir


def _project(directory: Path, backend: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = "name: egress-proxies\nruntime: python\n"
    if backend is not None:
        text += f"backend:\n  url: {backend}\n"
    (directory / "Pulumi.yaml").write_text(text)
    return directory


def test_the_variable_wins_over_the_project(tmp_path: Path) -> None:
    project = _project(tmp_path / "p", "file://./.pulumi-state")
    env = {"PULUMI_BACKEND_URL": f"file://{tmp_path}/elsewhere"}
    assert backend_dir(project, env) == tmp_path / "elsewhere"


def test_the_project_s_relative_url_is_from_the_project_directory(tmp_path: Path) -> None:
    project = _project(tmp_path / "p", "file://./.pulumi-state")
    assert backend_dir(project, {}) == project / ".pulumi-state"
    # An empty variable is no variable, as the CLI reads it.
    assert backend_dir(project, {"PULUMI_BACKEND_URL": ""}) == project / ".pulumi-state"
    assert default_path(project, "egress-proxies", "dev") == (
        project / ".pulumi-state" / "autopilot" / "egress-proxies" / "dev.json"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///srv/pulumi?no_tmp_dir=true", Path("/srv/pulumi")),
        ("file://~/state", Path.home() / "state"),
        ("s3://bucket/state", None),
        ("https://api.pulumi.com", None),
    ],
)
def test_urls_of_the_project(tmp_path: Path, url: str, expected: Path | None) -> None:
    assert backend_dir(_project(tmp_path, url), {}) == expected


def test_no_backend_named_keeps_the_round_state_in_the_project(tmp_path: Path) -> None:
    project = _project(tmp_path, None)
    assert backend_dir(project, {}) is None
    (tmp_path / "Pulumi.yaml").unlink()
    assert backend_dir(project, {}) is None


def test_default_path_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(tmp_path, None)
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    assert default_path(project, "egress-proxies", "dev") == project / ".autopilot" / "dev.json"
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}/b")
    assert default_path(project, "egress-proxies", "dev") == (
        tmp_path / "b" / "autopilot" / "egress-proxies" / "dev.json"
    )
