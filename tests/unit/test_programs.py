"""Every program the project runs comes from one of its own package lists.

The registry (scripts/programs.txt) names each external program with its
Debian package; these tests hold it to the package lists, to dpkg's own
records, and to what the scripts and the Python code call."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.programs import (
    NON_DEBIAN,
    ROOT,
    SYSTEM_DIRS,
    Entry,
    ExecRecorder,
    classify,
    listed_packages,
    python_commands,
    python_files,
    read_registry,
    shell_commands,
    shell_scripts,
    unregistered,
)

REGISTRY = read_registry()
BUILT = {"(bootstrap)", "(kube)"}


def _always_installed(package: str) -> bool:
    """Part of every Debian system: Essential, or Priority required."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Essential} ${Priority}", package],
        capture_output=True,
        text=True,
    )
    essential, _, priority = done.stdout.partition(" ")
    return done.returncode == 0 and (essential == "yes" or priority == "required")


def _candidates(entry: Entry) -> list[str]:
    """The paths dpkg may record the program under (usr-merged aliases too)."""
    if os.path.isabs(entry.program):
        bases = [entry.program]
    else:
        bases = [os.path.join(d, entry.program) for d in SYSTEM_DIRS]
    found = [p for p in bases if os.access(p, os.X_OK)]
    paths: list[str] = []
    for path in found:
        for p in (path, os.path.realpath(path)):
            paths.append(p)
            if p.startswith("/usr/"):
                paths.append(p[len("/usr") :])
    return list(dict.fromkeys(paths))


@functools.cache
def _owners() -> dict[str, set[str]]:
    """Path -> the packages dpkg says own it, for every registered program at
    once (each `dpkg -S` reads dpkg's whole database)."""
    paths = sorted({p for e in REGISTRY.values() for p in _candidates(e)})
    done = subprocess.run(["dpkg", "-S", *paths], capture_output=True, text=True)
    owners: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("diversion by"):
            continue
        head, _, path = line.partition(": ")
        owners.setdefault(path, set()).update(p.strip().split(":")[0] for p in head.split(","))
    return owners


@pytest.mark.parametrize("name", sorted(n for n, e in REGISTRY.items() if e.package not in BUILT))
def test_registered_program_is_installed_by_its_listed_package(name: str) -> None:
    # What the project's own builds make: tests/integration/test_built_programs.py.
    entry = REGISTRY[name]
    assert entry.package in NON_DEBIAN or not entry.package.startswith("("), entry
    if entry.package == "(machine)":
        assert name == "go", f"scripts/programs.txt:{entry.line}: only Go comes with the machine"
        done = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.startswith("go1."), done.stderr
        assert int(done.stdout.split(".")[1]) >= 26, done.stdout
        return
    lists = listed_packages()
    assert entry.package in lists or _always_installed(entry.package), (
        f"scripts/programs.txt:{entry.line}: {name} comes from {entry.package}, "
        f"which no package list of the project installs ({', '.join(sorted(set(lists.values())))})"
    )
    paths = _candidates(entry)
    assert paths, (
        f"{name} is not installed (looked in {', '.join(SYSTEM_DIRS)}); package {entry.package}"
    )
    owners = set().union(*(_owners().get(p, set()) for p in paths))
    assert entry.package in owners, (
        f"scripts/programs.txt:{entry.line}: dpkg says {name} ({paths[0]}) comes from "
        f"{', '.join(sorted(owners)) or 'no package'}, not {entry.package}"
    )


def _external(names: set[str]) -> set[str]:
    """Leave out the project's own programs (relative paths: scripts/, .venv/bin/)."""
    return {n for n in names if "/" not in n or os.path.isabs(n)}


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_program_a_script_runs_is_registered(script: Path) -> None:
    missing = unregistered(_external(shell_commands(script.read_text())), REGISTRY)
    assert not missing, f"{script.relative_to(ROOT)} runs {missing}, not in scripts/programs.txt"


def test_every_program_the_python_code_runs_by_name_is_registered() -> None:
    found: dict[str, str] = {}
    for path in python_files():
        for name in _external(python_commands(path.read_text())):
            found.setdefault(name, str(path.relative_to(ROOT)))
    missing = unregistered(found, REGISTRY)
    assert not missing, {
        m: next(f for n, f in found.items() if os.path.basename(n) == m) for m in missing
    }


# ---- the scanners themselves ------------------------------------------------


def test_shell_scan_sees_wrappers_bash_c_and_function_arguments() -> None:
    script = """#!/usr/bin/env bash
set -euo pipefail
helper() { "$@"; }
in_tree() { chroot "$TREE" "$@"; }
cat /etc/hostname | sort -u
runuser -u nobody -- virsh list
exec qemu-img info x
x=$(sgdisk -p disk)
bash -c "mcopy -i a b"
helper 30 "wait" ssh-keygen -l
in_tree systemctl enable squid
command -v shfmt >/dev/null
[[ -f x ]] && echo yes
"""
    assert shell_commands(script) == {
        "cat",
        "sort",
        "runuser",
        "virsh",
        "qemu-img",
        "sgdisk",
        "bash",
        "mcopy",
        "ssh-keygen",
        "chroot",
    }


def test_python_scan_sees_argv_lists_which_and_constants() -> None:
    source = """
import shutil, subprocess, asyncio, os, sys
TOOL = shutil.which("isoinfo") or "/usr/bin/isoinfo"
ARGV = ["xmllint", "--noout"]
subprocess.run(["qemu-img", "info"])
subprocess.Popen([TOOL, "-l"])
subprocess.run(ARGV)
subprocess.check_output("blkid -p x", shell=True)
asyncio.create_subprocess_exec("squid", "-N")
subprocess.run([sys.executable, "-m", "x"])
shutil.which("unshare")
"""
    assert python_commands(source) == {
        "isoinfo",
        "/usr/bin/isoinfo",
        "xmllint",
        "qemu-img",
        "blkid",
        "squid",
        "unshare",
    }


def test_recorder_names_system_programs_and_missing_ones(tmp_path: Path) -> None:
    recorder = ExecRecorder()
    recorder("subprocess.Popen", ("/usr/bin/env", ["env"], None, None))
    recorder("subprocess.Popen", (None, ["no-such-program-xyz", "-v"], None, None))
    recorder("subprocess.Popen", (str(ROOT / ".venv/bin/ruff"), ["ruff"], None, None))
    own = tmp_path / "stand-in"
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    recorder("subprocess.Popen", ("stand-in", ["stand-in"], None, {"PATH": str(tmp_path)}))
    recorder("os.exec", (b"/bin/true", [b"true"], None))
    assert set(recorder.seen) == {"env", "no-such-program-xyz", "true"}


def test_classify_resolves_bare_names_through_the_given_path(tmp_path: Path) -> None:
    assert classify("sh", "/usr/bin:/bin") == "sh"
    assert classify("definitely-missing", str(tmp_path)) == "definitely-missing"
