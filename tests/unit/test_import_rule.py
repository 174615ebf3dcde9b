"""The package rule (docs/architecture.md, "Packages"), as `lint-imports` in
scripts/test checks it: kept by this checkout, broken by a core module that
imports a backend or a backend that imports another."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.programs import ROOT

LINT = ROOT / ".venv" / "bin" / "lint-imports"
PACKAGES = ("proxyinfra", "providers", "discovery", "health", "client")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{root}:{root}/client/src", "PATH": "/usr/bin:/bin"},
    )


def test_this_checkout_keeps_every_contract() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    with (ROOT / "pyproject.toml").open("rb") as config:
        contracts = len(tomllib.load(config)["tool"]["importlinter"]["contracts"])
    assert f"Contracts: {contracts} kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "proxyinfra/fleet.py",
            "import providers.kvm.deploy",
            "the core reaches backends only through proxyinfra.registry, never by import BROKEN",
        ),
        (
            "providers/gcp/deploy.py",
            "from providers.kvm.config import KvmHost",
            "backends do not import one another BROKEN",
        ),
        (
            "discovery/fleet.py",
            "import providers.external",
            "the discovery service and the health engine know no backend (only the manifest) BROKEN",
        ),
        (
            "client/src/egress_proxies_client/_pool.py",
            "import scrapy",
            "only the client's Scrapy middleware imports Scrapy BROKEN",
        ),
        (
            "discovery/fleet.py",
            "import egress_proxies_client.scrapy",
            "only the client's Scrapy middleware imports Scrapy BROKEN",
        ),
        (
            "client/src/egress_proxies_client/_api.py",
            "import discovery.book.views",
            "the crawler client knows nothing of the infrastructure BROKEN",
        ),
        (
            "discovery/app.py",
            "import egress_proxies_client",
            "only the gateway's ban policy imports the client BROKEN",
        ),
        (
            "discovery/gateway/holds.py",
            "import egress_proxies_client",
            "only the gateway's ban policy imports the client BROKEN",
        ),
        (
            "discovery/gateway/forward.py",
            "from discovery.sqlite.book import SqliteBook",
            "the HTTP layer knows the lease contract, not a store BROKEN",
        ),
        (
            "discovery/sqlite/book.py",
            "import discovery.postgres.queries",
            "the two lease stores never import each other BROKEN",
        ),
        (
            "discovery/hotpath.py",
            "from discovery.sqlite.book import SqliteBook",
            "the HTTP layer knows the lease contract, not a store BROKEN",
        ),
        (
            "discovery/book/views.py",
            "import discovery.postgres.book",
            "the lease contract knows neither store BROKEN",
        ),
        (
            "health/engine.py",
            "from twisted.internet import reactor",
            "only the client's Scrapy middleware imports Scrapy BROKEN",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout
    assert contract in done.stdout, done.stdout
