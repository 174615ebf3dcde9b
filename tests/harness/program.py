"""Run a whole Pulumi program under mocks, in a subprocess (one root stack per process).

With hybrid=True, dynamic resources really run through a ProviderProcess (Check, then
Create) while everything else is mocked; "destroy" deletes them again, newest first.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.harness.engine import PROJECT_ROOT, default_python

Mode = Literal["up", "destroy", "up-destroy"]


@dataclass(frozen=True)
class RegisteredResource:
    type: str
    name: str
    urn: str
    custom: bool
    parent: str | None  # the parent's URN (the stack's for top-level resources)
    id: str | None
    inputs: dict[str, Any]  # secrets unwrapped, "__provider" left out
    outputs: dict[str, Any]
    secret_inputs: list[str]
    secret_outputs: list[str]
    error: str | None  # set when the registration failed
    # URNs it waits for: depends_on and the resources whose outputs its inputs use
    dependencies: list[str] = field(default_factory=list)
    # Its options the engine acts on at a replacement.
    replace_on_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool = False


@dataclass(frozen=True)
class ProgramError:
    message: str  # for pulumi.RunError exactly its message, else "Type: message"
    type: str
    traceback: str


@dataclass(frozen=True)
class ProgramResult:
    # In the order registrations reached the mock monitor: a resource always comes after
    # those whose outputs it uses and after its parent; independent ones may interleave.
    resources: list[RegisteredResource]
    outputs: dict[str, Any]  # resolved stack outputs, secrets unwrapped
    secret_outputs: list[str]
    error: ProgramError | None
    created: list[str]  # URNs of the dynamic resources created (hybrid), in order
    deleted: list[str]  # URNs deleted by destroy, in order
    destroy_error: ProgramError | None
    provider_log: str  # stderr and stdout of the dynamic provider process
    stdout: str  # of the program's process
    stderr: str
    state_file: Path | None = None

    def resources_of_type(self, type_: str) -> list[RegisteredResource]:
        return [r for r in self.resources if r.type == type_]

    def resource(self, name: str, type_: str | None = None) -> RegisteredResource:
        """The one resource with this name (and type, when given)."""
        found = [r for r in self.resources if r.name == name and type_ in (None, r.type)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} resources named {name!r}; have {self.names()}")
        return found[0]

    def children_of(self, parent: RegisteredResource) -> list[RegisteredResource]:
        return [r for r in self.resources if r.parent == parent.urn]

    def names(self) -> list[str]:
        return [r.name for r in self.resources]

    def output(self, name: str) -> Any:
        if name not in self.outputs:
            raise KeyError(f"no stack output {name!r}; have {sorted(self.outputs)}")
        return self.outputs[name]

    def is_secret(self, output_name: str) -> bool:
        self.output(output_name)
        return output_name in self.secret_outputs

    def raise_for_error(self) -> ProgramResult:
        """Raise when the program or the destroy failed; return self otherwise."""
        for what, err in (("program", self.error), ("destroy", self.destroy_error)):
            if err is not None:
                raise AssertionError(f"{what} failed: {err.message}\n{err.traceback}")
        return self


def run_program(
    target: str,
    config: Mapping[str, object] | None = None,
    *,
    stack: str = "dev",
    project: str = "egress-proxies",
    hybrid: bool = False,
    mode: Mode = "up",
    state_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    rpc_timeout: float = 60.0,
    secret_config: Sequence[str] = (),
    new_resource_hook: str | None = None,
    call_hook: str | None = None,
) -> ProgramResult:
    """Run `target` ("module:function" returning the stack outputs) under mocks.

    Config keys without a namespace get the project's; values that are not strings are
    passed as JSON strings, as Pulumi passes structured config. Hooks are "module:function"
    names imported in the program's process: new_resource_hook(MockResourceArgs) may
    return (id, outputs) or None for the default; call_hook(MockCallArgs) a dict or None.
    rpc_timeout bounds each call to the dynamic provider (hybrid): raise it above the
    resources' own waits (a VM's ipTimeoutSeconds), or a slow create is cut off.
    """
    if mode not in ("up", "destroy", "up-destroy"):
        raise ValueError(f"unknown mode {mode!r}")
    if mode == "destroy" and state_file is None:
        raise ValueError("mode='destroy' needs the state_file written by mode='up'")
    with tempfile.TemporaryDirectory(prefix="run-program-") as tmp:
        work = Path(tmp)
        state = Path(state_file) if state_file is not None else work / "state.json"
        if mode == "up" and state.exists() and json.loads(state.read_text())["resources"]:
            raise ValueError(f"{state} still holds resources: destroy them first")
        request = {
            "target": target,
            "config": _config(config or {}, project),
            "secret_keys": [_key(k, project) for k in secret_config],
            "project": project,
            "stack": stack,
            "hybrid": hybrid,
            "mode": mode,
            "state_file": str(state),
            "result_file": str(work / "result.json"),
            "provider_log": str(work / "provider.log"),
            "rpc_timeout": rpc_timeout,
            "hooks": {"new_resource": new_resource_hook, "call": call_hook},
        }
        (work / "request.json").write_text(json.dumps(request))
        run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run_env.update(env or {})
        proc = subprocess.run(
            [str(default_python()), "-m", "tests.harness.run_program", str(work / "request.json")],
            cwd=PROJECT_ROOT,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        result_file = work / "result.json"
        if not result_file.exists():
            raise RuntimeError(
                f"program runner exited {proc.returncode} without a result:\n{proc.stderr}"
            )
        raw = json.loads(result_file.read_text())
        log = work / "provider.log"
        provider_log = log.read_text(errors="replace") if log.exists() else ""
    return ProgramResult(
        resources=[RegisteredResource(**r) for r in raw["resources"]],
        outputs=raw["outputs"],
        secret_outputs=raw["secret_outputs"],
        error=_error(raw["error"]),
        created=raw["created"],
        deleted=raw["deleted"],
        destroy_error=_error(raw["destroy_error"]),
        provider_log=provider_log,
        stdout=proc.stdout,
        stderr=proc.stderr,
        state_file=Path(state_file) if state_file is not None else None,
    )


def _key(key: str, project: str) -> str:
    return key if ":" in key else f"{project}:{key}"


def _config(config: Mapping[str, object], project: str) -> dict[str, str]:
    return {_key(k, project): v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


def _error(raw: dict[str, str] | None) -> ProgramError | None:
    return ProgramError(**raw) if raw is not None else None
