"""scripts/build-proxy-image is cached between runs and rebuilt only when its
recipe changes (the script, its package list, the image's cloud-init settings
and the versions apt resolves).

The image itself is proved by test_end_to_end.py (built in the background by
scripts/test, or by the first test that needs it when the cache is cold);
here it is only taken from the cache, and a copy of the script in a project
of its own says, with --check, whether a run would build (a build takes
minutes; its result is the end-to-end test's).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.images import ROOT, proxy_image

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "scripts" / "build-proxy-image"
PACKAGE_LIST = ROOT / "scripts" / "proxy-image-packages.txt"
CLOUD_CFG = ROOT / "scripts" / "proxy-image-cloud.cfg"
NAME = "debian-proxy"
OUTPUTS = (f"{NAME}.qcow2", f"{NAME}.qcow2.sha256", f"{NAME}.packages", f"{NAME}.stamp")


def build(script: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script), *flags, str(out)], capture_output=True, text=True, timeout=1800, check=False
    )


def mtimes(paths: list[Path]) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in paths}


@pytest.mark.timeout(1800)
def test_cached_until_the_recipe_changes(tmp_path: Path) -> None:
    image = proxy_image()
    cache = image.path.parent
    outputs = [cache / name for name in OUTPUTS]
    before = mtimes(outputs)

    again = proxy_image()
    assert again.cached, again.log
    assert again.path == image.path
    assert mtimes(outputs) == before, "a cached run wrote"

    # A copy of the script is a project of its own, its outputs copied beside it.
    scripts = tmp_path / "project" / "scripts"
    scripts.mkdir(parents=True)
    script = scripts / SCRIPT.name
    shutil.copy2(SCRIPT, script)
    package_list = scripts / PACKAGE_LIST.name
    shutil.copy2(PACKAGE_LIST, package_list)
    cloud_cfg = scripts / CLOUD_CFG.name
    shutil.copy2(CLOUD_CFG, cloud_cfg)
    shutil.copytree(SCRIPT.parent / "lib", scripts / "lib")  # what the script sources
    out = tmp_path / "images"
    out.mkdir()
    for path in outputs:
        shutil.copy2(path, out / path.name)
    copied = [out / name for name in OUTPUTS]

    assert build(script, out, "--check").returncode == 0  # same recipe in another place
    same = build(script, out)
    assert same.returncode == 0 and "cached:" in same.stderr, same.stderr
    assert same.stdout.strip() == str(out / f"{NAME}.qcow2")

    # A change of the recipe, or of the image the stamp describes, is a build;
    # --check says so and writes nothing.
    changes: dict[str, Callable[[], object]] = {
        "script": lambda: script.write_text(script.read_text() + "# a recipe change\n"),
        "package list": lambda: package_list.write_text(package_list.read_text() + "# a change\n"),
        "cloud-init settings": lambda: cloud_cfg.write_text(cloud_cfg.read_text() + "# a change\n"),
        "image": lambda: (out / f"{NAME}.qcow2").open("ab").write(b"\0"),
    }
    for what, change in changes.items():
        saved = {
            p: p.read_bytes() for p in (script, package_list, cloud_cfg, out / f"{NAME}.qcow2")
        }
        change()
        written = mtimes(copied)
        check = build(script, out, "--check")
        assert check.returncode == 3, (what, check.stderr)
        assert "would build: the recipe" in check.stderr and check.stdout == "", (
            what,
            check.stderr,
        )
        assert mtimes(copied) == written, f"--check wrote after a change of the {what}"
        for path, data in saved.items():
            path.write_bytes(data)
        assert build(script, out, "--check").returncode == 0, f"{what}: restored, still stale"

    (out / f"{NAME}.packages").unlink()
    gone = build(script, out, "--check")
    assert gone.returncode == 3 and f"would build: no complete image in {out}" in gone.stderr
