"""Which dynamic-provider host the real CLI runs: the project's (a `plugins:`
entry of Pulumi.yaml naming scripts/pulumi-resource-pulumi-python), whatever
is on PATH, and without the warning the engine prints for a plugin it takes
from PATH. No host needed: a kvm preview contacts nothing, and the `up` is of
a program of the test's own whose resources touch only files."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.pulumi_cli import PULUMI, ROOT, CliStack
from tests.support.stack_config import placement, proxy, stack_config, unreachable_kvm_provider

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

PLUGIN = "pulumi-resource-pulumi-python"


def kvm_config(tmp_path: Path) -> dict[str, Any]:
    return stack_config(
        [unreachable_kvm_provider(tmp_path)], [proxy("a", "home", where=placement())]
    )


def path_with_decoy(tmp_path: Path) -> str:
    """PATH as scripts/up and scripts/test set it, with a plugin of the same
    name before everything else: one the engine must not run."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / PLUGIN).write_text("#!/bin/sh\necho 'the plugin on PATH ran' >&2\nexit 1\n")
    (decoy / PLUGIN).chmod(0o755)
    return f"{decoy}:{PULUMI.parent}:{os.environ.get('PATH', '')}"


def test_preview_runs_the_projects_host_without_a_warning(tmp_path: Path) -> None:
    stack = CliStack(
        tmp_path / "project",
        "plugins",
        kvm_config(tmp_path),
        extra_env={"PATH": path_with_decoy(tmp_path)},
    )
    # -v=9 logs each plugin the engine starts, with its path, on stderr.
    done = stack.ok("preview", "-v=9", "--logtostderr", timeout=300)
    assert "pulumi-python:dynamic:Resource a-0-domain create" in done.stdout, done.stdout[-3000:]
    assert "from $PATH" not in done.stdout + done.stderr
    assert "warning" not in done.stdout.lower(), done.stdout[-3000:]
    launched = [ln for ln in done.stderr.splitlines() if "Launching plugin 'pulumi-python" in ln]
    assert launched, done.stderr[-3000:]
    assert all(f"from '{ROOT / 'scripts' / PLUGIN}'" in ln for ln in launched), launched


# A program of eight dynamic resources whose creates each wait (up to WAIT
# seconds) until all eight have started: together only in a host that serves
# more than 4 calls at once (providers/dynamic_host.py), not in the SDK's.
TOGETHER = """\
import time
from pathlib import Path

import pulumi
from pulumi.dynamic import CreateResult, Resource, ResourceProvider

COUNT, WAIT = 8, 20


class Together(ResourceProvider):
    def create(self, props):
        directory = Path(props["directory"])
        (directory / props["name"]).touch()
        deadline = time.monotonic() + WAIT
        while len(list(directory.iterdir())) < COUNT and time.monotonic() < deadline:
            time.sleep(0.05)
        together = len(list(directory.iterdir())) >= COUNT
        return CreateResult(props["name"], {**props, "together": together})


class Held(Resource):
    together: pulumi.Output[bool]

    def __init__(self, name, directory):
        props = {"name": name, "directory": directory, "together": None}
        super().__init__(Together(), name, props)


directory = pulumi.Config().require("directory")
pulumi.export("together", [Held(f"r{i}", directory).together for i in range(COUNT)])
"""


def test_up_runs_eight_creates_at_once_in_the_projects_host(tmp_path: Path) -> None:
    program = tmp_path / "program"
    program.mkdir()
    (program / "__main__.py").write_text(textwrap.dedent(TOGETHER))
    started = tmp_path / "started"
    started.mkdir()
    stack = CliStack(
        tmp_path / "project",
        "together",
        {"directory": str(started)},
        extra_env={"PATH": path_with_decoy(tmp_path)},
        program=program,
    )
    done = stack.ok("up", "--yes", "--skip-preview", "--parallel", "16", timeout=300)
    assert "from $PATH" not in done.stdout + done.stderr
    assert "warning" not in done.stdout.lower(), done.stdout[-3000:]
    assert stack.output("together") == [True] * 8, "the SDK's host runs 4 creates at a time"
