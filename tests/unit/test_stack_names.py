"""A stack named as the CLI takes it (`dev`, `org/dev`, `org/project/dev`) is
one stack with one short name: the engine's URNs, `pulumi.get_stack()`, the
stack's `Pulumi.<name>.yaml` and a file backend's paths all use it (the CLI
writes `Pulumi.dev.yaml` and `.pulumi/stacks/<project>/dev.json` for
`organization/<project>/dev`, checked with pulumi 3.274); its file is in
Pulumi.yaml's `stackConfigDir` when it names one, as the CLI keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyinfra.cli import main
from proxyinfra.stackfile import load_stack, project_name, stack_file, stack_parts
from proxyinfra.validation import ConfigError


@pytest.mark.parametrize(
    ("given", "parts"),
    [
        ("dev", (None, "dev")),
        ("organization/dev", (None, "dev")),  # org/stack: the project is the current one
        ("organization/egress-proxies/dev", ("egress-proxies", "dev")),
    ],
)
def test_a_name_s_project_and_short_name(given: str, parts: tuple[str | None, str]) -> None:
    assert stack_parts(given) == parts


def test_a_qualified_name_reads_the_stack_file_the_cli_writes(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  egress-proxies:proxies: []\n")
    qualified = "organization/egress-proxies/dev"
    assert stack_file(tmp_path, qualified) == stack_file(tmp_path, "dev")
    assert stack_file(tmp_path, "dev") == tmp_path / "Pulumi.dev.yaml"
    assert load_stack(tmp_path, qualified) == load_stack(tmp_path, "dev")


def test_the_stack_config_dir_of_pulumi_yaml_holds_the_stack_files(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: egress-proxies\nstackConfigDir: config/stacks\n")
    expected = tmp_path / "config" / "stacks" / "Pulumi.dev.yaml"
    assert stack_file(tmp_path, "dev") == stack_file(tmp_path, "organization/p/dev") == expected


def test_a_pulumi_yaml_that_is_no_yaml_is_named(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: [egress-proxies\n")
    with pytest.raises(ConfigError) as raised:
        project_name(tmp_path)
    [issue] = raised.value.issues
    assert issue.path == str(tmp_path / "Pulumi.yaml") and "not valid YAML" in issue.message


@pytest.mark.parametrize("command", [["gc"], ["hosts", "check"]])
@pytest.mark.parametrize("name", ["../x", "a/b/c/d", ""])
def test_the_operator_commands_refuse_what_is_no_stack_name(
    command: list[str], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything is read: the name makes the stack file's path."""
    with pytest.raises(SystemExit) as exited:
        main(["--project-dir", str(tmp_path), *command, "--stack", name])
    assert exited.value.code == 2
    assert f"argument --stack: {name!r}: not a stack name" in capsys.readouterr().err
