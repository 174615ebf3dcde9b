"""Guest images built (and cached) by the project's scripts: the tiny UEFI test
image of scripts/build-test-image, the Debian proxy image of
scripts/build-proxy-image and its bare variant, and the package repository of
scripts/build-apt-repo."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(script: str, timeout: float, **env: str) -> tuple[Path, str]:
    """Runs scripts/<script>: the path it prints last, and its progress (stderr)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/{script} failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1]), done.stderr


def tiny_image() -> Path:
    """Path of tiny-uefi.qcow2 (its .raw twin lies beside it)."""
    return _build("build-test-image", timeout=900)[0]


@dataclass(frozen=True)
class BuiltImage:
    path: Path
    seconds: float  # what this call took
    cached: bool  # the recipe was unchanged: nothing was built
    log: str  # the script's progress (stage times when it built)


def proxy_image(variant: str = "full") -> BuiltImage:
    """debian-proxy.qcow2, or with variant "bare" debian-bare.qcow2 (no squid,
    no guest agent); its .sha256 and .packages lie beside it. A build from
    nothing takes minutes, a cached one about a second."""
    started = time.monotonic()
    path, log = _build("build-proxy-image", timeout=1800, PROXY_IMAGE_VARIANT=variant)
    return BuiltImage(
        path=path,
        seconds=time.monotonic() - started,
        cached="build-proxy-image: cached:" in log,
        log=log,
    )


def apt_repo() -> Path:
    """The signed repository of squid and qemu-guest-agent (its directory;
    key.asc inside is its public key)."""
    return _build("build-apt-repo", timeout=900)[0]
