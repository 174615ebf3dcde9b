"""The programs of the registry (scripts/programs.txt) that the project's own
builds make are where their builds put them: beside the Pulumi CLI that
scripts/bootstrap linked, once its build ended; the Kubernetes binaries and
the pulumi-kubernetes plugin once theirs did (the marks make these wait for
the builds). Debian's programs: tests/unit/test_programs.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from proxyinfra.plugins import pulumi_home
from tests.support.programs import ROOT, read_registry

REGISTRY = read_registry()

pytestmark = pytest.mark.integration


def kube_built(name: str) -> Path:
    """Where the Kubernetes builds leave NAME (the directory scripts/build-kube
    prints; the plugin as scripts/bootstrap --kubernetes installs it)."""
    if name == "pulumi-resource-kubernetes":
        home = pulumi_home()
        installed = sorted(home.glob(f"plugins/resource-kubernetes-v*/{name}"))
        return installed[-1] if installed else home / "plugins" / name
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-kube")], capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1]) / name


@pytest.mark.pulumi_cli
@pytest.mark.parametrize(
    "name", sorted(n for n, e in REGISTRY.items() if e.package == "(bootstrap)")
)
def test_what_bootstrap_builds_is_beside_the_cli(name: str) -> None:
    # Beside the CLI that scripts/bootstrap linked as .venv/bin/pulumi, where
    # the engine looks for its plugins.
    cli = (ROOT / ".venv" / "bin" / "pulumi").resolve()
    assert os.access(cli.parent / name, os.X_OK), f"{name} is not beside {cli}"


@pytest.mark.pulumi_cli
@pytest.mark.kubernetes
@pytest.mark.parametrize("name", sorted(n for n, e in REGISTRY.items() if e.package == "(kube)"))
def test_what_the_kubernetes_builds_make_is_where_they_put_it(name: str) -> None:
    assert os.access(kube_built(name), os.X_OK), f"{name} is not where its build put it"
