"""Resource plugins a backend needs, looked up where the engine looks."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyinfra.plugins import Plugin, installed, sdk_plugin


def test_the_sdk_names_the_plugin_it_was_generated_for() -> None:
    gcp = sdk_plugin("pulumi_gcp")
    assert gcp.name == "gcp" and gcp.version.startswith("10.")
    assert gcp.install == f"pulumi plugin install resource gcp v{gcp.version}"
    assert sdk_plugin("pulumi_kubernetes").name == "kubernetes"


def executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_found_in_the_plugin_cache_or_on_path_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = Plugin("gcp", "10.2.0")
    home = tmp_path / "home"
    monkeypatch.setenv("PULUMI_HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert not installed(plugin)
    # Another version in the cache does not count.
    executable(home / "plugins" / "resource-gcp-v10.1.0" / "pulumi-resource-gcp")
    assert not installed(plugin)
    executable(home / "plugins" / "resource-gcp-v10.2.0" / "pulumi-resource-gcp")
    assert installed(plugin)
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "empty"))
    assert not installed(plugin)
    executable(tmp_path / "bin" / "pulumi-resource-gcp")
    assert installed(plugin)
