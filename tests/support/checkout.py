"""The checkout as a user meets it: scripts/up run with the user's
environment, and a fresh clone of the checkout (for tests that must see what
a run leaves in it: `git status`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.pulumi_cli import PULUMI

ROOT = Path(__file__).resolve().parents[2]


def user_env(**extra: str) -> dict[str, str]:
    """The user's environment, without a PULUMI_* setting of the developer's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    return {**env, **extra}


def run_up(*args: str, root: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "scripts" / "up"), *args],
        env=user_env(**env),
        capture_output=True,
        text=True,
        timeout=1800,  # a proxy image build from nothing
    )


def git(clone: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(clone), *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def fresh_clone(where: Path) -> Path:
    """The checkout's files as they are now (tracked and new ones, not what git
    ignores) committed in a repository of their own, with a .venv of its own
    that sees this checkout's packages (bootstrap's stamp says they match, so it
    installs nothing) and this checkout's testbed (.testbed/env; git ignores .testbed/)."""
    clone = where / "clone"
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    git(clone.parent, "init", "-q", str(clone))
    git(clone, "add", "-A")
    author = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    git(clone, *author, "commit", "-q", "-m", "the checkout as it is")
    venv = clone / ".venv"
    # No pip of its own (ensurepip costs 3 CPU-seconds a clone): the
    # checkout's, through the .pth below, serves `python -m pip`.
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [
            str(python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "checkout-packages.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    # The checkout's stamp, as scripts/bootstrap wrote it for these same files.
    shutil.copy2(ROOT / ".venv" / ".lock-sha256", venv / ".lock-sha256")
    (venv / "bin" / "pulumi").symlink_to(PULUMI.resolve())
    (clone / ".testbed").mkdir()
    (clone / ".testbed" / "env").symlink_to(ROOT / ".testbed" / "env")
    return clone
