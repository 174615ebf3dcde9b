"""The real stack behind the seam: Pulumi's Automation API (``pulumi.automation``,
the SDK the project pins) on the project directory's own program, stack,
config file and backend, the ones `pulumi up` uses by hand; no second
source of truth.

- Config is read from ``Pulumi.<stack>.yaml`` as the other operator
  commands read it (proxyinfra/stackfile.py) and written with
  ``set_config(..., path=True)`` (what `pulumi config set --path` does).
- That file gets the autopilot's edits and nothing of the backend's (no
  ``encryptionsalt``: saltless.py), so `scripts/up` runs on them next.
- On a file backend the state's resources and the number of updates are
  read from the backend's files (statefile.py): no CLI command, no
  secrets manager. Elsewhere `stack export` runs, and the updates are
  counted from the history.
- Two commands are run through the Automation API's command runner
  rather than its ``Stack`` methods, since those decrypt every secret of
  the state into this process: ``export_stack`` exports with
  ``--show-secrets``, and ``up`` reads every output (twice, plain and
  revealed) after the update. The autopilot needs neither: it reads URNs
  and creation times, and an update's summary from the history. Each of
  those is one more read of the whole state, too: at 400 proxies they were
  half the round's engine CPU (docs/autopilot.md, "Cost measured").
- An update whose creates are all taken over after a kill (kvm) runs with
  ``PULUMI_SKIP_CHECKPOINTS=true``, and every update without the file
  backend's second copy of the state, unless the operator set either
  (``update_env``).
- Each command runs with a ``TMPDIR`` of its own, removed after it
  (``scratch_env``): pulumi-kubernetes leaves its kubeconfig there.
- The lock: on a file (DIY) backend the lock files under
  ``.pulumi/locks/`` name their holder (user@host, pid, since), and a dead
  one on this host is named stale with its remedy (locks.py); on any
  backend an update that finds the stack locked fails fast with
  ConcurrentUpdateError, turned into StackBusy with the holder the engine's
  message names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from pulumi import automation as auto

from proxyinfra.autopilot.failure import cli_error, failure_summary
from proxyinfra.autopilot.locks import lock_holder
from proxyinfra.autopilot.saltless import fallback_env, keeping_saltless
from proxyinfra.autopilot.seam import (
    Deployed,
    DeployedResource,
    StackBusy,
    StackUnavailable,
    Updated,
    UpdateFailed,
)
from proxyinfra.autopilot.statefile import checkpoint_resources, update_count
from proxyinfra.partial import ticket
from proxyinfra.stackfile import NAMESPACE, backend_dir, read_raw, stack_file, stack_parts

T = TypeVar("T")
_HOLDER = re.compile(r"created by (\S+) \(pid (\d+)\) at (\S+)")
SKIP_CHECKPOINTS = "PULUMI_SKIP_CHECKPOINTS"
NO_BACKUPS = "PULUMI_DIY_BACKEND_DISABLE_CHECKPOINT_BACKUPS"
TMPDIR = "TMPDIR"


def update_env(checkpoints: bool, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The engine's settings for one of the autopilot's updates; an
    operator's own (in the environment the CLI inherits) win, either way.

    - ``PULUMI_SKIP_CHECKPOINTS=true`` when the update may skip its per-step
      checkpoints (targets.py).
    - ``PULUMI_DIY_BACKEND_DISABLE_CHECKPOINT_BACKUPS=true``: after each
      update a file backend copies the state into the stack's history and
      the same bytes again into ``.pulumi/backups/`` (pulumi 3.274
      ``backend/diy/backend.go``, ``addToHistory`` then ``backupStack``);
      the history's copy stays, the second would double what an autopilot
      that changes the stack many times a day adds to the disk."""
    wanted = {NO_BACKUPS: "true"} if checkpoints else {SKIP_CHECKPOINTS: "true", NO_BACKUPS: "true"}
    return {key: value for key, value in wanted.items() if key not in environ}


@contextlib.contextmanager
def scratch_env(env: dict[str, str]) -> Iterator[str]:
    """ENV with ``TMPDIR`` naming a new private directory (0700, under the
    one this process was given) for one command, removed after it with
    whatever the command left there.

    pulumi-kubernetes (4.25) writes a copy of its provider's kubeconfig,
    client key included, to a new ``$TMPDIR/kubeconfig*`` file each time
    the engine configures the provider, and never removes it: an autopilot
    that changes a kubernetes stack every round would leave one per
    update (docs/kubernetes-provider.md, "Temporary files")."""
    parent = os.environ.get(TMPDIR) or None
    where = tempfile.mkdtemp(prefix="egress-proxies-pulumi-", dir=parent)
    before = env.get(TMPDIR)
    env[TMPDIR] = where
    try:
        yield where
    finally:
        if before is None:
            env.pop(TMPDIR, None)
        else:
            env[TMPDIR] = before
        shutil.rmtree(where, ignore_errors=True)


def _holder_of(text: str) -> str | None:
    found = _HOLDER.search(text)
    return f"{found.group(1)} (pid {found.group(2)}) since {found.group(3)}" if found else None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


class AutomationStack:
    def __init__(
        self, project_dir: Path, name: str, command: auto.PulumiCommand | None = None
    ) -> None:
        # The short name (URNs, the stack file, the backend's paths, the
        # service's names); NAME as given selects it, org and project included.
        self.name = stack_parts(name)[1]
        self.project_dir = project_dir
        # The workspace's environment, read at each command: a ticket's entry
        # is put in for the update it is for (proxyinfra/partial.py).
        self._env: dict[str, str] = fallback_env()
        self._file = stack_file(project_dir, name)
        # A file backend's directory (its checkpoint, history and locks are
        # read there, not through the CLI), or None for any other backend.
        self._backend = backend_dir(project_dir)
        try:
            workspace = auto.LocalWorkspace(work_dir=str(project_dir), pulumi_command=command)
        except OSError as error:  # the API runs `pulumi version` first
            raise StackUnavailable(f"cannot run the pulumi CLI: {error}") from None
        workspace.env_vars = self._env  # (passed as an argument, an empty dict is copied)
        try:
            self._stack = self._cli(lambda: auto.Stack.select(name, workspace))
        except auto.CommandError as error:
            raise StackUnavailable(f"stack {name!r}: {cli_error(str(error))}") from None
        self._project = workspace.project_settings().name

    def read(self) -> Deployed:
        raw = read_raw(self._file)
        root = self._backend
        found = checkpoint_resources(root, self._project, self.name) if root else None
        if found is None:
            try:
                exported = self._cli(lambda: self._run(["stack", "export"]))
            except auto.CommandError as error:
                raise StackUnavailable(f"stack {self.name!r}: {cli_error(str(error))}") from None
            found = (json.loads(exported.stdout).get("deployment") or {}).get("resources") or []
        resources = [
            DeployedResource(
                urn=r["urn"],
                type=r.get("type", ""),
                parent=r.get("parent") or None,
                created=_time(r.get("created")),
                provider=r.get("provider") or None,
            )
            for r in found
        ]
        return Deployed(config=raw, resources=resources)

    def set_config(self, path: str, value: int | None) -> None:
        key = f"{NAMESPACE}:{path}"
        if value is None:
            self._cli(lambda: self._stack.remove_config(key, path=True))
        else:
            config = auto.ConfigValue(value=str(value))
            self._cli(lambda: self._stack.set_config(key, config, path=True))

    def lock_holder(self) -> str | None:
        root = self._backend
        if root is None:
            return None
        return lock_holder(root, self._project, self.name)

    def update(
        self,
        message: str,
        targets: Sequence[str],
        registers: Sequence[str],
        *,
        checkpoints: bool = True,
    ) -> Updated:
        if not targets:
            raise ValueError("an update without targets would be a whole `pulumi up`")
        try:
            with ticket(self.name, registers) as entry:
                for_update = {**entry, **update_env(checkpoints)}
                self._env.update(for_update)
                try:
                    self._cli(lambda: self._up(message, targets))
                finally:
                    for key in for_update:
                        self._env.pop(key, None)
        except auto.ConcurrentUpdateError as error:
            # The lock file says more than the engine's message (a dead holder).
            raise StackBusy(self.lock_holder() or _holder_of(str(error))) from None
        except auto.CommandError as error:
            raise UpdateFailed(failure_summary(str(error))) from None
        (summary,) = self._cli(lambda: self._stack.history(page_size=1, show_secrets=False))
        root = self._backend
        number = (
            summary.version
            or (update_count(root, self._project, self.name) if root else None)
            or len(self._cli(lambda: self._stack.history(show_secrets=False)))
        )
        changes = {str(op): n for op, n in (summary.resource_changes or {}).items()}
        return Updated(number, changes, str(summary.start_time))

    def refresh(self, targets: Sequence[str]) -> None:
        args = ["refresh", "--yes", "--skip-preview"]
        args += [f"--target={urn}" for urn in targets]
        try:
            self._cli(lambda: self._run([*args, "--color=never", "--suppress-progress"]))
        except auto.ConcurrentUpdateError as error:
            raise StackBusy(self.lock_holder() or _holder_of(str(error))) from None
        except auto.CommandError as error:
            raise UpdateFailed(failure_summary(str(error))) from None

    def _cli(self, command: Callable[[], T]) -> T:
        """Every CLI command of this stack: the stack file keeps no salt it
        wrote (saltless.py), and the command's temporary files go to a
        directory of its own, removed after it (``scratch_env``)."""
        with scratch_env(self._env):
            return keeping_saltless(self._file, command)

    def _run(self, args: list[str]) -> auto.CommandResult:
        """ARGS on this stack, with the workspace's command and environment
        (a ticket's entry among it), raising what the Automation API raises."""
        workspace = self._stack.workspace
        command = [*args, "--stack", self.name]
        return workspace.pulumi_command.run(command, workspace.work_dir, dict(self._env))

    def _up(self, message: str, targets: Sequence[str]) -> None:
        args = ["up", "--yes", "--skip-preview", "--message", message, "--target-dependents"]
        args += [f"--target={urn}" for urn in targets]
        self._run([*args, "--color=never", "--suppress-outputs", "--suppress-progress"])
