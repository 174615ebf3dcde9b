"""The real Pulumi CLI (what scripts/bootstrap put at .venv/bin/pulumi) on a
stack of the project's own program, as an operator runs it.

Each `CliStack` is a project directory of its own under a test's tmp_path: a
Pulumi.yaml naming this checkout's program (`main`) and virtualenv, the
stack's Pulumi.<stack>.yaml, a local file backend and a passphrase of its own,
and a PULUMI_HOME of its own, so nothing lands in the checkout or in ~/.pulumi.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from proxyinfra.plugins import pulumi_home

ROOT = Path(__file__).resolve().parents[2]
PULUMI = ROOT / ".venv" / "bin" / "pulumi"
PROJECT = "egress-proxies"
# scripts/up's removal of an empty `<stack>.json.attrs` (drop_empty_attrs).
FILE_BACKEND_SH = ROOT / "scripts" / "lib" / "filebackend.sh"


@dataclass
class CliStack:
    directory: Path
    stack: str
    config: Mapping[str, Any]
    extra_env: Mapping[str, str] = field(default_factory=dict)
    passphrase: str = "cli-test-passphrase"
    program: Path = ROOT  # the directory of the program's __main__.py
    # Resource plugins (e.g. "kubernetes") of the user's PULUMI_HOME, where
    # scripts/bootstrap installs them, seen by this stack's own PULUMI_HOME.
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "state").mkdir(exist_ok=True)
        self.tmpdir.mkdir(exist_ok=True)
        project = {
            "name": PROJECT,
            "runtime": {
                "name": "python",
                "options": {"toolchain": "pip", "virtualenv": str(ROOT / ".venv")},
            },
            "main": os.path.relpath(self.program, self.directory),
            # The project's dynamic-provider host, as in the checkout's Pulumi.yaml.
            "plugins": {"providers": [{"name": "pulumi-python", "path": str(ROOT / "scripts")}]},
        }
        (self.directory / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
        self.write_config(self.config)
        self._link_plugins()
        done = self.run("stack", "init", self.stack)
        if done.returncode != 0:
            raise AssertionError(f"pulumi stack init {self.stack}: {done.stderr}")

    def _link_plugins(self) -> None:
        shared = pulumi_home() / "plugins"
        own = self.directory / "pulumi-home" / "plugins"
        for name in self.plugins:
            found = sorted(shared.glob(f"resource-{name}-v*[0-9]"))
            if not found:
                raise AssertionError(
                    f"no {name} plugin in {shared}: scripts/bootstrap --kubernetes"
                )
            for plugin in found:
                # A directory of its own (the engine skips symlinked ones)
                # holding links to the installed files.
                mine = own / plugin.name
                mine.mkdir(parents=True, exist_ok=True)
                for file in plugin.iterdir():
                    if not (mine / file.name).exists():
                        (mine / file.name).symlink_to(file)

    @property
    def tmpdir(self) -> Path:
        """The CLI's TMPDIR: pulumi-kubernetes leaves a copy of its kubeconfig
        (client key included) in it at each run (docs/kubernetes-provider.md,
        "Temporary files"); here it stays in the test's own directory."""
        return self.directory / "tmp"

    @property
    def stack_file(self) -> Path:
        return self.directory / f"Pulumi.{self.stack}.yaml"

    def read_config(self) -> dict[str, Any]:
        """The stack's config as its file holds it now (keys without the
        namespace): with what the autopilot set there (`generations`)."""
        doc = yaml.safe_load(self.stack_file.read_text()) or {}
        prefix = f"{PROJECT}:"
        return {
            k[len(prefix) :]: v
            for k, v in (doc.get("config") or {}).items()
            if k.startswith(prefix)
        }

    def write_config(self, config: Mapping[str, Any]) -> None:
        """The stack's config (keys without the namespace), keeping pulumi's own keys."""
        old = yaml.safe_load(self.stack_file.read_text()) if self.stack_file.exists() else {}
        keep = {k: v for k, v in (old or {}).items() if k != "config"}
        doc = {**keep, "config": {f"{PROJECT}:{k}": v for k, v in config.items()}}
        self.stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.config = config

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
        env.update(
            PATH=f"{PULUMI.parent}:{os.environ.get('PATH', '')}",
            PULUMI_HOME=str(self.directory / "pulumi-home"),
            PULUMI_BACKEND_URL=f"file://{self.directory / 'state'}",
            TMPDIR=str(self.tmpdir),
            PULUMI_CONFIG_PASSPHRASE=self.passphrase,
            PULUMI_SKIP_UPDATE_CHECK="true",
            PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true",
            # The dynamic provider process unpickles providers by reference.
            PYTHONPATH=str(ROOT),
            NO_COLOR="1",
        )
        env.update(self.extra_env)
        return env

    def run(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        """`pulumi ARGS --stack STACK` (no --stack for `stack init`), never raising."""
        argv = [str(PULUMI), *args, "--non-interactive", "--color", "never"]
        if args[:2] != ("stack", "init"):
            argv += ["--stack", self.stack]
        else:
            argv += ["--secrets-provider", "passphrase"]
        return subprocess.run(
            argv,
            cwd=self.directory,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        """`pulumi ARGS --stack STACK` in the background (output piped, stderr
        into stdout), for a test that kills it or runs two at once."""
        argv = [str(PULUMI), *args, "--non-interactive", "--color", "never", "--stack", self.stack]
        return subprocess.Popen(
            argv,
            cwd=self.directory,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def ok(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        done = self.run(*args, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(
                f"pulumi {' '.join(args)} exited {done.returncode}\n"
                f"--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-4000:]}"
            )
        return done

    @property
    def attrs_file(self) -> Path:
        """The file backend's sidecar of the stack's checkpoint, which a run
        killed while writing it leaves empty."""
        return (
            self.directory / "state" / ".pulumi" / "stacks" / PROJECT / f"{self.stack}.json.attrs"
        )

    def drop_empty_attrs(self) -> str:
        """What scripts/up does before each command (scripts/lib/filebackend.sh,
        run as is): removes the empty `*.attrs` a killed run can leave under
        the backend's `.pulumi/stacks/`, which fail every command with
        "failed to load checkpoint: EOF". Returns its warnings."""
        script = '. "$1" && drop_empty_attrs "$2"'
        state = self.directory / "state"
        done = subprocess.run(
            ["bash", "-c", script, "drop_empty_attrs", str(FILE_BACKEND_SH), str(state)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise AssertionError(f"drop_empty_attrs exited {done.returncode}: {done.stderr}")
        return done.stderr

    def forget_killed_run(self) -> None:
        """The documented first step of the recovery after a killed run: an
        empty `<stack>.json.attrs` it left is removed as scripts/up does
        (drop_empty_attrs), then `pulumi cancel --yes` ends the update it left
        in progress (on the local file backend: removes its lock); the lock
        is gone afterwards."""
        self.drop_empty_attrs()
        self.ok("cancel", "--yes")
        locks = self.directory / "state" / ".pulumi" / "locks"
        assert not [p for p in locks.rglob("*") if p.is_file()], "pulumi cancel left a lock"

    def output(self, name: str) -> Any:
        done = self.ok("stack", "output", name, "--json", "--show-secrets")
        return json.loads(done.stdout)

    def export(self) -> dict[str, Any]:
        return json.loads(self.ok("stack", "export").stdout)  # type: ignore[no-any-return]

    def resources(self) -> list[dict[str, Any]]:
        return list(self.export()["deployment"].get("resources") or [])


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (plugins may start process groups of their own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def freeze_run(process: subprocess.Popen[Any]) -> None:
    """SIGSTOP a `pulumi` run and everything it started: nothing it does
    after this moment happens (kill_run then ends it where it stood)."""
    import signal

    # The engine first, before the walk of /proc (tens of ms on a busy
    # machine): stopped, it sends its providers nothing more.
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGSTOP)
    for pid in descendants(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)


def kill_run(process: subprocess.Popen[Any]) -> None:
    """SIGKILL a `pulumi` run and everything it started (language host,
    providers), as a crash or the OOM killer would end them."""
    import signal

    for pid in [process.pid, *descendants(process.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)
