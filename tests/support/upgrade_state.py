"""A stack's state as an earlier release of the program left it, for the
upgrade test (tests/engine/test_cli_state_upgrade.py): recorded once by
running this module with that release checked out, kept in
tests/golden/state/, imported into a new stack by the test.

The recording is one kvm proxy on one simulated host, exported with
`pulumi stack export`; the directory it was made in (key files) is written
as WHERE, so the test puts its own directory there, and the image's URL is
kept as it was (nothing downloads it again: a no-change run asks no host).

Record (with the release to record checked out):
    .venv/bin/python -m tests.support.upgrade_state tests/golden/state/NAME.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from tests.support.baseimages import random_qcow2, serve
from tests.support.http import FileServer
from tests.support.pulumi_cli import CliStack
from tests.support.simulated_fleet import fleet_config, simulated_env

WHERE = "@WHERE@"
STACK = "upgraded"


def config(where: Path, image_url: str) -> dict[str, Any]:
    """The stack's config, the same at recording and in the test."""
    return fleet_config(1, 1, where, image_url)


def image_url(state: dict[str, Any]) -> str:
    """The URL the recorded BaseImage was made from."""
    for resource in state["deployment"]["resources"]:
        if "url" in (resource.get("inputs") or {}):
            return str(resource["inputs"]["url"])
    raise AssertionError("no BaseImage in the recorded state")


def load(golden: Path, where: Path) -> dict[str, Any]:
    """The recorded state with WHERE put back as WHERE."""
    state: dict[str, Any] = json.loads(golden.read_text().replace(WHERE, str(where)))
    return state


def record(out: Path) -> None:
    with TemporaryDirectory(prefix="upgrade-state-") as tmp, FileServer() as server:
        where = Path(tmp)
        image = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16))
        stack = CliStack(
            where / "stack", STACK, config(where, image.url), simulated_env(where / "hosts")
        )
        stack.ok("up", "--yes", "--skip-preview")
        text = json.dumps(stack.export(), indent=1, sort_keys=True)
    out.write_text(text.replace(str(where), WHERE) + "\n")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
