"""Resource plugins a backend needs, found where the Pulumi engine looks for
them, so that a stack without them fails in the all-errors message, before
any resource is registered, instead of midway through with the engine's
"no resource plugin found" and the program's interrupted traceback."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class Plugin:
    name: str  # e.g. "gcp": the binary is pulumi-resource-gcp
    version: str  # without the v

    @property
    def binary(self) -> str:
        return f"pulumi-resource-{self.name}"

    @property
    def install(self) -> str:
        return f"pulumi plugin install resource {self.name} v{self.version}"


def sdk_plugin(package: str) -> Plugin:
    """The plugin a provider SDK package (pulumi_gcp, ...) was generated for."""
    info = json.loads(resources.files(package).joinpath("pulumi-plugin.json").read_text())
    return Plugin(str(info["name"]), str(info["version"]))


def _search_dirs() -> list[Path]:
    """Where the engine looks: $PATH, beside the pulumi binary, then the plugin cache."""
    dirs = [Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    if cli := shutil.which("pulumi"):
        dirs.append(Path(cli).resolve().parent)
    return dirs


def pulumi_home() -> Path:
    """The engine's home: its plugin cache is `plugins/` below it."""
    return Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")


def installed(plugin: Plugin) -> bool:
    cached = pulumi_home() / "plugins" / f"resource-{plugin.name}-v{plugin.version}" / plugin.binary
    if cached.is_file() and os.access(cached, os.X_OK):
        return True
    return any(os.access(d / plugin.binary, os.X_OK) for d in _search_dirs())
