"""The tiny UEFI test image, built (and cached) by scripts/build-test-image."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tiny_image() -> Path:
    """Path of tiny-uefi.qcow2 (its .raw twin lies beside it)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-test-image")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-test-image failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])
