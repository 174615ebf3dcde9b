"""Helpers shared by the test tiers (real services on loopback, golden files)."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
ROOT = Path(__file__).resolve().parents[2]


def proxyinfra_cli(
    project: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m proxyinfra --project-dir PROJECT ARGS...`, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "proxyinfra", "--project-dir", str(project), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def assert_golden(name: str, actual: str) -> None:
    """Compare text with tests/golden/NAME; UPDATE_GOLDEN=1 rewrites the file.

    A difference fails with a unified diff.  Regenerate deliberately, then
    review the diff of the golden files before committing them.
    """
    path = GOLDEN_DIR / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    if not path.exists():
        raise AssertionError(f"missing golden file {path}; run with UPDATE_GOLDEN=1")
    expected = path.read_text()
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"golden/{name}",
            tofile="rendered",
        )
        raise AssertionError(
            f"rendered text differs from golden/{name} (UPDATE_GOLDEN=1 regenerates):\n"
            + "".join(diff)
        )
