"""What a stack's Pulumi state owns on the hosts, for `gc`.

Reads `pulumi stack export` output, a local-backend checkpoint file, or the
engine harness's state file: any JSON with a `resources` list whose dynamic
resources carry host object names in their outputs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxyinfra.stackfile import backend_dir, stack_parts
from proxyinfra.validation import ConfigError, ConfigIssue

# Outputs of the kvm resources that name objects on a host.
NAME_KEYS = ("name", "volume", "marker")
DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass
class OwnedObjects:
    names: set[str] = field(default_factory=set)
    logical_names: set[str] = field(default_factory=set)


def _resources(document: Any) -> list[dict[str, Any]]:
    if isinstance(document, dict):
        if isinstance(document.get("resources"), list):
            return [r for r in document["resources"] if isinstance(r, dict)]
        for key in ("deployment", "checkpoint", "latest"):
            if key in document:
                return _resources(document[key])
    return []


def owned_objects(document: Any) -> OwnedObjects:
    owned = OwnedObjects()
    for resource in _resources(document):
        outputs = resource.get("outputs") or {}
        for key in NAME_KEYS:
            if isinstance(outputs.get(key), str):
                owned.names.add(outputs[key])
        if isinstance(outputs.get("logicalName"), str):
            owned.logical_names.add(outputs["logicalName"])
    return owned


def load_state(project_dir: Path, project: str, stack: str, state_file: Path | None) -> Any:
    """The stack's state: from --state, else `pulumi stack export`, else the
    checkpoint of the file backend the CLI would use (`backend_dir`). Never
    guessed: unreadable is an error."""
    if state_file is not None:
        return json.loads(state_file.read_text())
    if shutil.which("pulumi"):
        done = subprocess.run(
            ["pulumi", "stack", "export", "--stack", stack],
            cwd=project_dir,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            return json.loads(done.stdout)
    root = backend_dir(project_dir)
    short = stack_parts(stack)[1]
    checkpoint = root / ".pulumi" / "stacks" / project / f"{short}.json" if root else None
    if checkpoint is not None and checkpoint.is_file():
        return json.loads(checkpoint.read_text())
    raise ConfigError(
        [
            ConfigIssue(
                "--state",
                f"cannot read the state of stack {stack!r}: pass --state FILE "
                f"(from `pulumi stack export --stack {stack} > FILE`)",
            )
        ]
    )


def parse_duration(text: str) -> float:
    match = DURATION_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 2h, 1d)")
    return float(match.group(1)) * UNITS[match.group(2)]
