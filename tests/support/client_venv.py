"""The crawler client installed as a crawler team installs it: the wheel that
scripts/build-client builds (sdist first, then the wheel from it), `pip
install`ed into a fresh virtualenv with wheels only (`--only-binary=:all:`,
so nothing is compiled on the way), at the versions requirements.lock pins
(a constraints file: the extra's packages are the ones the project tests).
Nothing of the project is on that environment's path: its programs run with
their working directory outside the checkout and no PYTHONPATH.

    def test_x(client_venv: ClientVenv) -> None:
        client_venv.run("-c", "import egress_proxies_client")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.programs import ROOT

# The distributions a requirement pulls in, walked in the environment itself
# (importlib.metadata, and pip's own vendored `packaging` for the markers).
_CLOSURE = """
import json, sys
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

def closure(name, extras):
    seen, todo = set(), [(name, tuple(extras))]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if (key, extras) in seen:
            continue
        seen.add((key, extras))
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or ("",)):
                todo.append((req.name, tuple(req.extras)))
    return sorted({key for key, _ in seen})

installed = sorted({canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()})
print(json.dumps({"installed": installed, "closure": closure(sys.argv[1], sys.argv[2:])}))
"""


@dataclass(frozen=True)
class ClientVenv:
    root: Path
    wheel: Path
    sdist: Path
    extras: tuple[str, ...]
    install_seconds: float
    baseline: frozenset[str]  # what a fresh virtualenv holds (pip, setuptools)

    @property
    def python(self) -> str:
        return _python(self.root)

    def env(self) -> dict[str, str]:
        """The environment without anything pointing into the project."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.root / 'bin'}:/usr/bin:/bin"
        return env

    def run(
        self, *args: str, cwd: Path | None = None, timeout: float = 300, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, *args],
            cwd=cwd or self.root,
            env={**self.env(), **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def distributions(self) -> tuple[set[str], set[str]]:
        """(every distribution installed, the closure of egress-proxies-client[extras])."""
        done = self.run("-c", _CLOSURE, "egress-proxies-client", *self.extras)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        return set(found["installed"]), set(found["closure"])


def _python(root: Path) -> str:
    """The virtualenv's interpreter (made by the test: in a temporary directory)."""
    return str(root / "bin" / "python")


def build_dist(where: Path) -> tuple[Path, Path]:
    """(wheel, sdist) built by scripts/build-client into `where`."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-client"), str(where)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    wheel = Path(done.stdout.strip().splitlines()[-1])
    [sdist] = where.glob("*.tar.gz")
    return wheel, sdist


def make_venv(root: Path, wheel: Path, sdist: Path, extras: tuple[str, ...]) -> ClientVenv:
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    listed = subprocess.run(
        [_python(root), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    baseline = frozenset(d["name"].lower() for d in json.loads(listed.stdout))
    wanted = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    started = time.monotonic()
    install = [_python(root), "-m", "pip", "install", "--disable-pip-version-check"]
    constraints = ["-c", str(ROOT / "requirements.lock")]
    done = subprocess.run(
        [*install, "--only-binary=:all:", *constraints, wanted],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Building wheel" not in done.stdout, "a source distribution was built"
    return ClientVenv(root, wheel, sdist, extras, seconds, baseline)


@pytest.fixture(scope="session")
def client_dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_dist(tmp_path_factory.mktemp("client-dist"))


@pytest.fixture(scope="session")
def client_venv(
    tmp_path_factory: pytest.TempPathFactory, client_dist: tuple[Path, Path]
) -> Iterator[ClientVenv]:
    """The wheel with its `[scrapy]` extra, in a virtualenv of its own."""
    yield make_venv(tmp_path_factory.mktemp("client-venv"), *client_dist, ("scrapy",))


__all__ = ["ClientVenv", "build_dist", "client_dist", "client_venv", "make_venv"]
