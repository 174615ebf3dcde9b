"""A stack named as the CLI takes it (`dev`, `org/dev`, `org/project/dev`) is
one stack with one short name: the engine's URNs, `pulumi.get_stack()`, the
stack's `Pulumi.<name>.yaml` and a file backend's paths all use it (the CLI
writes `Pulumi.dev.yaml` and `.pulumi/stacks/<project>/dev.json` for
`organization/<project>/dev`, checked with pulumi 3.274)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyinfra.stackfile import load_stack, stack_file, stack_parts


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
