"""Guest images built (and cached) by the project's scripts: the tiny UEFI test
image of scripts/build-test-image and the Debian proxy image of
scripts/build-proxy-image."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BuiltImage:
    path: Path
    seconds: float  # what this call took
    cached: bool  # the recipe was unchanged: nothing was built
    log: str  # the script's progress (stage times when it built)


def proxy_image() -> BuiltImage:
    """debian-proxy.qcow2 (its .sha256 and .packages lie beside it); a build
    from nothing takes minutes, a cached one about a second."""
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-proxy-image")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-proxy-image failed:\n{done.stderr}")
    return BuiltImage(
        path=Path(done.stdout.strip().splitlines()[-1]),
        seconds=time.monotonic() - started,
        cached="build-proxy-image: cached:" in done.stderr,
        log=done.stderr,
    )
