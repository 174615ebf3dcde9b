"""Runs one Pulumi program under mocks; started by tests.harness.program.run_program.

Usage: python -m tests.harness.run_program REQUEST.json

One program per process: the root stack is global. The result is written as JSON to the
request's "result_file" (not stdout, which the program may print to).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
from pulumi.output import Unknown
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs, Mocks, set_mocks
from pulumi.runtime.stack import massage, run_pulumi_func
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from tests.harness.engine import PROVIDER_KEY, UNKNOWN, ProviderProcess

DYNAMIC_PREFIX = "pulumi-python:dynamic"
NewResourceHook = Callable[[MockResourceArgs], "tuple[str | None, dict[str, Any]] | None"]
CallHook = Callable[[MockCallArgs], "dict[str, Any] | None"]


class StateFile:
    """The dynamic resources the hybrid run created, in creation order."""

    def __init__(self, path: Path, project: str, stack: str) -> None:
        self.path = path
        self.project = project
        self.stack = stack
        self.resources: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def load(self) -> None:
        self.resources = json.loads(self.path.read_text())["resources"]

    def add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.resources.append(entry)
            self.save()  # at once, so a failing program still leaves what it created

    def save(self) -> None:
        data = {"project": self.project, "stack": self.stack, "resources": self.resources}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.path)


class HarnessMocks(Mocks):
    """Ordinary resources: outputs = inputs, id "<name>-id". Dynamic ones (hybrid): real."""

    def __init__(
        self,
        provider: ProviderProcess | None,
        state: StateFile | None,
        new_resource_hook: NewResourceHook | None,
        call_hook: CallHook | None,
    ) -> None:
        self.provider = provider
        self.state = state
        self.new_resource_hook = new_resource_hook
        self.call_hook = call_hook
        self.monitor: RecordingMonitor | None = None

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        resource_id, outputs = self._new_resource(args)
        # The engine marks additionalSecretOutputs secret; the SDK's mock monitor does not.
        secret = self.monitor.additional_secret_outputs() if self.monitor is not None else set()
        return resource_id, {
            k: rpc.wrap_rpc_secret(v) if k in secret and not rpc.is_rpc_secret(v) else v
            for k, v in outputs.items()
        }

    def _new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        if self.provider is not None and args.typ.startswith(DYNAMIC_PREFIX):
            return self._create_dynamic(args)
        if self.new_resource_hook is not None:
            answer = self.new_resource_hook(args)
            if answer is not None:
                return answer
        return (f"{args.name}-id" if args.custom else None), dict(args.inputs)

    def call(self, args: MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        answer = self.call_hook(args) if self.call_hook is not None else None
        return (answer or {}), []  # the SDK's mock monitor cannot take None for failures

    def _create_dynamic(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        # What the engine does on `up` for a new resource: Check, then Create. Inputs arrive
        # here secret-wrapped (always "__provider"); ProviderProcess unwraps them.
        assert self.provider is not None and self.state is not None and self.monitor is not None
        urn = self.monitor.current_urn()
        checked = self.provider.check(urn, {}, args.inputs)
        if checked.failures:
            reasons = "; ".join(f"{prop}: {reason}" for prop, reason in checked.failures)
            raise ValueError(f"check failed for {urn}: {reasons}")
        created = self.provider.create(urn, checked.inputs)
        self.state.add(
            {"urn": urn, "id": created.id, "inputs": checked.inputs, "outputs": created.properties}
        )
        # Like the engine for a provider without secret support: an output keeps the
        # secret mark of the input with the same name.
        outputs = {
            k: rpc.wrap_rpc_secret(v) if rpc.is_rpc_secret(args.inputs.get(k)) else v
            for k, v in created.properties.items()
        }
        return created.id, outputs


class RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, recording every registration with its URN and parent."""

    def __init__(self, mocks: HarnessMocks) -> None:
        super().__init__(mocks)
        mocks.monitor = self
        self.records: list[dict[str, Any] | None] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def current_urn(self) -> str:
        urn: str = self._local.urn
        return urn

    def additional_secret_outputs(self) -> set[str]:
        return set(getattr(self._local, "additional_secrets", ()))

    def RegisterResource(self, request: Any) -> Any:
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)  # type: ignore[no-untyped-call]
        urn = self.make_urn(request.parent, request.type, request.name)
        with self._lock:  # the order in which registrations reach the monitor
            index = len(self.records)
            self.records.append(None)
        _ensure_event_loop()  # type: ignore[no-untyped-call]  # resource refs need a loop here
        inputs, secret_inputs = plain_properties(rpc.deserialize_properties(request.object))
        record: dict[str, Any] = {
            "type": request.type,
            "name": request.name,
            "urn": urn,
            "custom": bool(request.custom),
            "parent": request.parent or None,
            "id": None,
            "inputs": inputs,
            "outputs": {},
            "secret_inputs": secret_inputs,
            "secret_outputs": [],
            "error": None,
            "dependencies": sorted(request.dependencies),
            "replace_on_changes": list(request.replaceOnChanges),
            "delete_before_replace": bool(request.deleteBeforeReplace),
        }
        self._local.urn = urn
        self._local.additional_secrets = list(request.additionalSecretOutputs)
        try:
            response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
            registration = self.resources[urn]
            record["id"] = registration.id or None
            record["outputs"], record["secret_outputs"] = plain_properties(registration.state)
            return response
        except BaseException as err:
            record["error"] = f"{type(err).__name__}: {err}"
            raise
        finally:
            self._local.urn = None
            self._local.additional_secrets = []
            self.records[index] = record


def plain_properties(props: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """JSON-ready values without "__provider", and the names of the secret ones."""
    secrets = sorted(k for k, v in props.items() if rpc.is_rpc_secret(v) and k != PROVIDER_KEY)
    return {k: plain(v) for k, v in props.items() if k != PROVIDER_KEY}, secrets


def plain(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return plain(rpc.unwrap_rpc_secret(value))
    if isinstance(value, Unknown):
        return UNKNOWN
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)  # resource references, assets


def load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def error_fields(err: BaseException) -> dict[str, Any]:
    if isinstance(err, pulumi.RunError):
        # The language host prints only the message for a RunError.
        message = str(err)
    else:
        message = "".join(traceback.format_exception_only(err)).strip()
    return {
        "message": message,
        "type": type(err).__name__,
        "traceback": "".join(traceback.format_exception(err)),
    }


def run_up(
    request: dict[str, Any], result: dict[str, Any], provider: ProviderProcess | None
) -> None:
    state = StateFile(Path(request["state_file"]), request["project"], request["stack"])
    state.save()
    hooks = request["hooks"]
    mocks = HarnessMocks(
        provider if request["hybrid"] else None,
        state,
        load(hooks["new_resource"]) if hooks.get("new_resource") else None,
        load(hooks["call"]) if hooks.get("call") else None,
    )
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_all_config(request["config"], request["secret_keys"])
    set_mocks(
        mocks, project=request["project"], stack=request["stack"], preview=False, monitor=monitor
    )

    def program() -> None:
        outputs = load(request["target"])()
        for name, value in (outputs or {}).items():
            pulumi.export(name, value)

    async def resolve_outputs() -> None:
        root = pulumi.runtime.get_root_resource()
        exported: dict[str, Any] = getattr(root, "outputs", {})
        for name, value in exported.items():
            output = pulumi.Output.from_input(massage(value, []))
            result["outputs"][name] = plain(await output.future())
            if await output.is_secret():
                result["secret_outputs"].append(name)

    try:
        _sync_await(run_pulumi_func(program))
        _sync_await(resolve_outputs())
    except Exception as err:  # reported to the test, not raised
        result["error"] = error_fields(err)
    finally:
        result["resources"] = [r for r in monitor.records if r is not None]
        result["created"] = [entry["urn"] for entry in state.resources]


def run_destroy(request: dict[str, Any], result: dict[str, Any], provider: ProviderProcess) -> None:
    # Like `pulumi destroy`: no program, delete what the state holds, newest first.
    state = StateFile(Path(request["state_file"]), request["project"], request["stack"])
    state.load()
    try:
        while state.resources:
            entry = state.resources[-1]
            provider.delete(entry["id"], entry["urn"], entry["outputs"], old_inputs=entry["inputs"])
            state.resources.pop()
            state.save()
            result["deleted"].append(entry["urn"])
    except Exception as err:  # reported to the test, not raised
        result["destroy_error"] = error_fields(err)


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    result: dict[str, Any] = {
        "resources": [],
        "outputs": {},
        "secret_outputs": [],
        "error": None,
        "created": [],
        "deleted": [],
        "destroy_error": None,
    }
    mode = request["mode"]
    needs_provider = request["hybrid"] or mode in ("destroy", "up-destroy")
    provider = ProviderProcess(
        project=request["project"],
        config=request["config"],
        log_path=request["provider_log"],
        rpc_timeout=request.get("rpc_timeout", 60.0),
    )
    try:
        if needs_provider:
            provider.start()  # from the main thread, which outlives every call
        if mode in ("up", "up-destroy"):
            run_up(request, result, provider)
        if mode in ("destroy", "up-destroy"):
            run_destroy(request, result, provider)
    finally:
        provider.close()
        Path(request["result_file"]).write_text(json.dumps(result, indent=1, default=repr))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gRPC and pulumi's executor threads can make it slow.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
