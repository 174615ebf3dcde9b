"""The registry of external programs (scripts/programs.txt) and the scans that
find which programs the project runs: shell scripts parsed by shfmt, Python
read with `ast`, and what the test process really executes (an audit hook).

Why: a clean clone on a developer's machine still has every package anyone
installed by hand there; only a list that is checked catches a program that
no package list of the project installs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "scripts" / "programs.txt"
# Every file whose packages a project script installs (scripts/bootstrap
# installs them all with this same glob).
PACKAGE_LISTS = tuple(sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("scripts/*packages.txt")))
# Where Debian puts programs; PATH is not used, since on a developer's machine
# it may find a copy no package installed (pyenv's python3, a hand-built tool).
SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Not a Debian package: the sources a registry entry may name instead.
NON_DEBIAN = {"(bootstrap)", "(kube)", "(machine)"}

BASH_BUILTINS = frozenset(
    [
        ".",
        ":",
        "[",
        "alias",
        "bg",
        "bind",
        "break",
        "builtin",
        "caller",
        "cd",
        "command",
        "compgen",
        "complete",
        "compopt",
        "continue",
        "declare",
        "dirs",
        "disown",
        "echo",
        "enable",
        "eval",
        "exec",
        "exit",
        "export",
        "false",
        "fc",
        "fg",
        "getopts",
        "hash",
        "help",
        "history",
        "jobs",
        "kill",
        "let",
        "local",
        "logout",
        "mapfile",
        "popd",
        "printf",
        "pushd",
        "pwd",
        "read",
        "readarray",
        "readonly",
        "return",
        "set",
        "shift",
        "shopt",
        "source",
        "suspend",
        "test",
        "times",
        "trap",
        "true",
        "type",
        "typeset",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "wait",
    ]
)
# Programs whose own arguments name another program to run on this machine:
# how many leading arguments (after options) to skip before it. `chroot DIR`
# runs a program of another tree, so it is not listed here.
WRAPPERS = {"exec": 0, "command": 0, "xargs": 0, "env": 0, "nohup": 0, "sudo": 0, "timeout": 1}


@dataclass(frozen=True)
class Entry:
    program: str  # a bare name, or an absolute path where the scripts use one
    package: str
    line: int


def read_registry(path: Path = REGISTRY) -> dict[str, Entry]:
    """Program name (basename) -> entry; a name registered twice is an error."""
    entries: dict[str, Entry] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise ValueError(f"{path}:{number}: want 'program package', got {raw!r}")
        name = os.path.basename(words[0])
        if name in entries:
            raise ValueError(f"{path}:{number}: {name!r} registered twice")
        entries[name] = Entry(words[0], words[1], number)
    return entries


def listed_packages() -> dict[str, str]:
    """Package -> the list that installs it."""
    found: dict[str, str] = {}
    for rel in PACKAGE_LISTS:
        for raw in (ROOT / rel).read_text().splitlines():
            name = raw.split("#", 1)[0].strip()
            if name:
                found.setdefault(name, rel)
    return found


# ---- shell scripts ---------------------------------------------------------


def shell_scripts() -> list[Path]:
    """Every bash script of the project (by its #! line), the libraries
    they source (scripts/lib/*.sh), and the scripts a backend puts on its
    VMs, which the tests run too (providers/*/*.sh)."""
    found = []
    for path in sorted([*ROOT.glob("scripts/*"), *ROOT.glob(".ci/*")]):
        if path.is_file() and path.read_bytes()[:64].startswith(b"#!/usr/bin/env bash"):
            found.append(path)
    return found + sorted(ROOT.glob("scripts/lib/*.sh")) + sorted(ROOT.glob("providers/*/*.sh"))


_SOURCED = re.compile(r'^\s*(?:\.|source)\s+"?\$ROOT/(scripts/lib/[\w.-]+\.sh)"?', re.MULTILINE)


# What a library of scripts/lib expects the script that sources it to have
# sourced first: the shared one, scripts/lib/common.sh (log, die, ...).
COMMON_LIBRARY = "scripts/lib/common.sh"


def _library_functions(library: str) -> set[str]:
    names: set[str] = set()
    for node in _walk(_parse_shell((ROOT / library).read_text())):
        if node.get("Type") == "FuncDecl":
            names.add(node["Name"]["Value"])  # type: ignore[index]
    return names


def _sourced_functions(text: str) -> set[str]:
    """Functions of the project's shell libraries that a script sources."""
    names: set[str] = set()
    for library in _SOURCED.findall(text):
        names |= _library_functions(library)
    return names


def _literal(word: dict[str, object]) -> str | None:
    """The text of a shfmt Word made only of literal parts, else None."""
    text = ""
    for part in word.get("Parts", []):  # type: ignore[attr-defined]
        kind = part["Type"]
        if kind in ("Lit", "SglQuoted"):
            text += part.get("Value", "")
        elif kind == "DblQuoted" and all(p["Type"] == "Lit" for p in part.get("Parts", [])):
            text += "".join(p["Value"] for p in part.get("Parts", []))
        else:
            return None
    return text


def _walk(node: object) -> Iterator[dict[str, object]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _parse_shell(text: str) -> object:
    done = subprocess.run(
        ["shfmt", "--to-json"], input=text, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def _after_wrapper(args: list[str | None], skip: int) -> str | None:
    """The program a wrapper runs: after `--`, else the first non-option word."""
    rest = args[1:]
    if "--" in rest:
        index = rest.index("--") + 1
        return rest[index] if index < len(rest) else None
    words = [a for a in rest if a is None or not a.startswith("-")]
    return words[skip] if len(words) > skip else None


def shell_commands(text: str) -> set[str]:
    """Programs a bash script runs: the first word of each simple command that
    is neither a builtin nor a function of the script, the program behind a
    wrapper (`runuser ... -- virsh`, `exec cmd`), inside `bash -c '...'`, and
    programs handed to the script's own functions (`try "what" userdel ...`)."""
    tree = _parse_shell(text)
    functions: set[str] = _sourced_functions(text)
    if text.startswith("# shellcheck shell=bash"):  # a library: its caller's functions
        functions |= _library_functions(COMMON_LIBRARY)
    in_chroot: set[str] = set()  # functions that run their arguments in another tree
    for node in _walk(tree):
        if node.get("Type") == "FuncDecl":
            name = node["Name"]["Value"]  # type: ignore[index]
            functions.add(name)
            if any(
                n.get("Type") == "CallExpr" and n.get("Args") and _literal(n["Args"][0]) == "chroot"  # type: ignore[index]
                for n in _walk(node["Body"])
            ):
                in_chroot.add(name)
    found: set[str] = set()
    for node in _walk(tree):
        if node.get("Type") != "CallExpr" or not node.get("Args"):
            continue
        args = [_literal(w) for w in node["Args"]]  # type: ignore[attr-defined]
        first = args[0]
        if first is None:
            continue
        if first in functions:
            # A function that runs one of its arguments: count the literal
            # single words that are programs on this machine.
            if first not in in_chroot:
                found |= {
                    a for a in args[1:] if a and a not in BASH_BUILTINS and _is_system_program(a)
                }
            continue
        if first in WRAPPERS or first == "runuser":
            inner = _after_wrapper(args, WRAPPERS.get(first, 0))
            if inner and first != "command":  # `command -v X` only looks X up
                found.add(inner)
            if first in BASH_BUILTINS:
                continue
        if first in ("bash", "sh") and len(args) > 2 and args[1] == "-c" and args[2]:
            found |= shell_commands(args[2])
        if first not in BASH_BUILTINS:
            found.add(first)
    return found


def _is_system_program(word: str) -> bool:
    if "/" in word:
        return os.path.isabs(word) and os.access(word, os.X_OK)
    return any(os.access(os.path.join(d, word), os.X_OK) for d in SYSTEM_DIRS)


# ---- Python ----------------------------------------------------------------

_RUNNERS = {
    ("subprocess", "run"),
    ("subprocess", "Popen"),
    ("subprocess", "call"),
    ("subprocess", "check_call"),
    ("subprocess", "check_output"),
    ("asyncio", "create_subprocess_exec"),
    ("os", "execv"),
    ("os", "execvp"),
    ("os", "execl"),
    ("os", "execlp"),
}


def python_files() -> list[Path]:
    dirs = ("proxyinfra", "providers", "health", "discovery", "tests", "bench")
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _strings(node: ast.AST | None) -> list[str]:
    return (
        [
            n.value
            for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        if node
        else []
    )


def python_commands(source: str) -> set[str]:
    """Programs a Python module runs with a literal name: the first element of
    the argv of subprocess/asyncio/os.exec calls, names looked up with
    shutil.which, and module constants assigned from those (`SQUID =
    shutil.which("squid") or "/usr/sbin/squid"`)."""
    tree = ast.parse(source)
    assigned: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
    found: set[str] = set()

    def program(arg: ast.AST) -> None:
        if isinstance(arg, ast.List | ast.Tuple) and arg.elts:
            program(arg.elts[0])
        elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.add(arg.value.split()[0] if arg.value.strip() else arg.value)
        elif isinstance(arg, ast.Name) and arg.id in assigned:
            value = assigned[arg.id]
            if isinstance(value, ast.List | ast.Tuple):
                program(value)
            else:
                found.update(s for s in _strings(value) if s and " " not in s)

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            key = (func.value.id, func.attr)
            if key in _RUNNERS or key == ("shutil", "which"):
                program(node.args[0])
    return found


# ---- what runs -------------------------------------------------------------


def resolve(executable: str, environ_path: str | None = None) -> str | None:
    """The absolute path a name or path runs, looked up in PATH as exec does."""
    if "/" in executable:
        return os.path.abspath(executable)
    for d in (environ_path or os.environ.get("PATH", "")).split(os.pathsep):
        candidate = os.path.join(d, executable)
        if d and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def classify(executable: str, environ_path: str | None = None) -> str | None:
    """The registry name an executed program must have, or None when it is
    the project's own or made by a test: the project tree (.venv/bin,
    scripts/), temporary directories, and the Python running the tests."""
    path = resolve(executable, environ_path)
    if path is None:
        return executable  # not found: exactly the case to catch
    if any(path.startswith(d + "/") for d in (str(ROOT), tempfile.gettempdir())):
        return None
    interpreters = {sys.executable, getattr(sys, "_base_executable", sys.executable)}
    if os.path.realpath(path) in {os.path.realpath(p) for p in interpreters}:
        return None
    return os.path.basename(path)


def unregistered(names: Iterable[str], registry: dict[str, Entry]) -> list[str]:
    return sorted({os.path.basename(n) for n in names} - set(registry))


class ExecRecorder:
    """Records every program this process starts (subprocess, os.exec*,
    posix_spawn) through Python's audit events."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}  # registry name -> the path or name run
        self.cli_runs = 0  # starts of a real `pulumi` (the project's own included)
        self.active = True

    def __call__(self, event: str, args: tuple[object, ...]) -> None:
        if not self.active:
            return
        if event == "subprocess.Popen":
            executable, argv = args[0], args[1]
            if executable is None and isinstance(argv, list | tuple) and argv:
                executable = argv[0]
            env = args[3] if len(args) > 3 and isinstance(args[3], dict) else None
            path = env.get("PATH") if env else None
        elif event in ("os.exec", "os.posix_spawn", "os.spawn"):
            executable = args[0] if event != "os.spawn" else args[1]
            path = None
        else:
            return
        if isinstance(executable, bytes):
            executable = os.fsdecode(executable)
        if isinstance(executable, os.PathLike):
            executable = os.fspath(executable)
        if not isinstance(executable, str):
            return
        environ_path = path if isinstance(path, str) else None
        name = classify(executable, environ_path)
        if name is not None:
            self.seen.setdefault(name, executable)
        if os.path.basename(executable) == "pulumi":
            # A real CLI, not a stand-in a test wrote to a temporary directory.
            where = resolve(executable, environ_path)
            in_tmp = where is not None and where.startswith(tempfile.gettempdir() + "/")
            if where is None or not in_tmp or where.startswith(str(ROOT) + "/"):
                self.cli_runs += 1
