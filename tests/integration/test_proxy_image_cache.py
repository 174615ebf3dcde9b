"""scripts/build-proxy-image is cached between runs and rebuilt only when its
recipe changes (the script, its package list and the versions apt resolves).

The image itself is proved by test_end_to_end.py, which runs first and builds
it when the cache is cold; here it is only taken from the cache, and a copy of
the script in a project of its own is rebuilt once (about three minutes).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.images import ROOT, proxy_image

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "scripts" / "build-proxy-image"
PACKAGE_LIST = ROOT / "scripts" / "proxy-image-packages.txt"
NAME = "debian-proxy"
OUTPUTS = (f"{NAME}.qcow2", f"{NAME}.qcow2.sha256", f"{NAME}.packages", f"{NAME}.stamp")


def build(script: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script), str(out)], capture_output=True, text=True, timeout=1800, check=False
    )


@pytest.mark.timeout(1800)
def test_cached_until_the_recipe_changes(tmp_path: Path) -> None:
    image = proxy_image()
    cache = image.path.parent
    outputs = [cache / name for name in OUTPUTS]
    before = {p: p.stat().st_mtime_ns for p in outputs}

    again = proxy_image()
    assert again.cached, again.log
    assert again.path == image.path
    assert {p: p.stat().st_mtime_ns for p in outputs} == before, "a cached run wrote"

    # A copy of the script is a project of its own: the cached outputs (and
    # the .debs, so nothing is downloaded again) copied beside it.
    scripts = tmp_path / "project" / "scripts"
    scripts.mkdir(parents=True)
    script = scripts / SCRIPT.name
    shutil.copy2(SCRIPT, script)
    shutil.copy2(PACKAGE_LIST, scripts / PACKAGE_LIST.name)
    out = tmp_path / "images"
    shutil.copytree(cache / ".debs" / NAME, out / ".debs" / NAME)
    for path in outputs:
        shutil.copy2(path, out / path.name)

    same = build(script, out)
    assert same.returncode == 0, same.stderr
    assert "cached:" in same.stderr, same.stderr  # same recipe in another place

    script.write_text(script.read_text() + "# a recipe change\n")
    started = time.monotonic()
    changed = build(script, out)
    assert changed.returncode == 0, changed.stderr
    assert "built in" in changed.stderr and "cached:" not in changed.stderr, changed.stderr
    assert time.monotonic() - started > 30
    assert (out / f"{NAME}.packages").read_text() == (cache / f"{NAME}.packages").read_text()

    third = build(script, out)
    assert third.returncode == 0, third.stderr
    assert "cached:" in third.stderr, third.stderr
