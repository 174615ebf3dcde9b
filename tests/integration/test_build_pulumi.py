"""scripts/build-pulumi: the CLI and its Python language host from the Go
module proxy, cached by version, and a failure that names its step and module."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.pulumi_cli import PULUMI, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

PLUGINS = (
    "pulumi-language-python",
    "pulumi-language-python-exec",
    "pulumi-resource-pulumi-python",
)


def pinned() -> dict[str, str]:
    values = {}
    for line in (ROOT / "scripts" / "pulumi-version").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            values[name] = value
    return values


def build(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "scripts" / "build-pulumi")],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, **env},
    )


def test_bootstrap_links_the_built_cli_with_its_plugins_beside_it() -> None:
    """What bootstrap left (it ran before the tests): .venv/bin/pulumi, the
    pinned version, the language host, its executor and the dynamic provider
    plugin beside it with run bits; a second build-pulumi run builds nothing."""
    cli = PULUMI.resolve()
    done = subprocess.run([str(PULUMI), "version"], capture_output=True, text=True, timeout=60)
    if cli.parent.name.startswith("pulumi-v"):  # ours (a user's own CLI is used as it is)
        assert done.stdout.strip() == pinned()["PULUMI_VERSION"]
        for name in PLUGINS:
            assert os.access(cli.parent / name, os.X_OK), name
        before = {p.name: p.stat().st_mtime_ns for p in cli.parent.iterdir()}
        again = build(ROOT)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == str(cli.parent)
        assert "build-pulumi: cached:" in again.stderr and "[2/5]" not in again.stderr
        assert {p.name: p.stat().st_mtime_ns for p in cli.parent.iterdir()} == before
    else:
        assert done.returncode == 0 and done.stdout.startswith("v3.")


def test_a_failed_step_names_the_step_and_the_module(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "build-pulumi", root / "scripts")
    shutil.copytree(ROOT / "scripts" / "lib", root / "scripts" / "lib")
    version = "v3.999.0"  # no such release
    (root / "scripts" / "pulumi-version").write_text(
        f"PULUMI_VERSION={version}\nPULUMI_PYTHON_HOST_SDK={pinned()['PULUMI_PYTHON_HOST_SDK']}\n"
    )
    done = build(root, EGRESS_PROXIES_CACHE=str(tmp_path / "cache"))
    assert done.returncode == 1
    assert (
        f"step [1/5] 'resolving the CLI's modules (about 290, first time about a minute)' failed "
        f"for module github.com/pulumi/pulumi/pkg/v3@{version}" in done.stderr
    ), done.stderr
    assert done.stdout == ""
    # Nothing half-made is left for the next run to mistake for a cache.
    assert not list((tmp_path / "cache").glob("pulumi-*"))


def test_without_go_it_says_what_is_missing(tmp_path: Path) -> None:
    # A PATH with bash and coreutils, without Go; nothing cached.
    done = build(ROOT, PATH="/usr/bin:/bin", EGRESS_PROXIES_CACHE=str(tmp_path / "cache"))
    assert done.returncode == 1
    assert "go is not installed; the CLI is built from Go modules (Go 1.26 or newer)" in done.stderr
