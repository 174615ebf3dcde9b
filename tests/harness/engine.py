"""Drive a Pulumi dynamic provider the way the Pulumi engine does.

The engine starts the dynamic-provider plugin (the project's runs `python -m
providers.dynamic_host`, the SDK's server with more workers) with the program
directory as working directory, reads the port it prints, and calls the ResourceProvider gRPC service. The
server declares acceptSecrets=False and no preview support, so the engine unwraps secrets
before sending and never sends Create/Update with preview=True; this client does the same.
"""

from __future__ import annotations

import json
import os
import select
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL, PIPE, Popen, TimeoutExpired
from types import TracebackType
from typing import IO, Any, Final, Literal, Self, TypedDict

import grpc
from google.protobuf import json_format, struct_pb2
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.output import Unknown
from pulumi.runtime import rpc
from pulumi.runtime._grpc_settings import _GRPC_CHANNEL_OPTIONS
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON: Final = PROJECT_ROOT / ".venv" / "bin" / "python"
DYNAMIC_TYPE: Final = "pulumi-python:dynamic:Resource"
# The project's plugin script (scripts/pulumi-resource-pulumi-python: the SDK's
# server with more workers); module="pulumi.dynamic" runs the SDK's own.
HOST_MODULE: Final = str(PROJECT_ROOT / "scripts" / "pulumi-resource-pulumi-python")
PROVIDER_KEY: Final = "__provider"
# The sentinel the engine puts on the wire for a value not known during preview.
UNKNOWN: Final[str] = rpc.UNKNOWN

# Runs before the provider: asks the kernel to SIGTERM it when the process that started
# it dies (the server never exits by itself), then execs exactly what the engine runs.
_LAUNCHER: Final = """\
import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
if os.getppid() != int(sys.argv[1]):
    sys.exit("parent exited before the provider started")
if sys.argv[2].endswith(".py") or "/" in sys.argv[2]:
    os.execv(sys.argv[2], [sys.argv[2]])  # the plugin script, as the engine starts it
os.execv(sys.executable, [sys.executable, "-u", "-m", sys.argv[2]])
"""


class ProviderError(Exception):
    """A provider call failed; `message` is the provider's own exception message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details  # the provider's full traceback text
        self.exception_type, self.message = _last_exception(details)
        super().__init__(f"{method}: {self.exception_type}: {self.message}")


@dataclass(frozen=True)
class CheckResponse:
    inputs: dict[str, Any]
    failures: list[tuple[str, str]]  # (property, reason)


@dataclass(frozen=True)
class DiffResponse:
    changes: Literal["unknown", "none", "some"]
    replaces: list[str]
    stables: list[str]
    delete_before_replace: bool

    @property
    def action(self) -> Literal["unknown", "same", "update", "replace"]:
        """What the engine would do with this answer."""
        if self.replaces:
            return "replace"
        if self.changes == "unknown":
            return "unknown"  # the engine then compares old and new inputs itself
        return "update" if self.changes == "some" else "same"


@dataclass(frozen=True)
class CreateResponse:
    id: str
    properties: dict[str, Any]


@dataclass(frozen=True)
class ReadResponse:
    id: str  # "" when the provider reports that the resource is gone
    properties: dict[str, Any]
    inputs: dict[str, Any] | None


def make_urn(
    name: str, type_: str = DYNAMIC_TYPE, *, project: str = "egress-proxies", stack: str = "dev"
) -> str:
    return f"urn:pulumi:{stack}::{project}::{type_}::{name}"


def provider_inputs(provider: ResourceProvider, props: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs as a pulumi.dynamic.Resource registers them: props plus the pickled provider."""
    if PROVIDER_KEY in props:
        raise ValueError(f"props must not contain {PROVIDER_KEY}")
    return {**props, PROVIDER_KEY: serialize_provider(provider)}


class ProviderProcess:
    """One `python -m pulumi.dynamic` server and a typed client for it.

    Use as a context manager (or call start()/close()). Safe to call from several threads.
    Create it from a long-lived thread: the server is terminated when that thread exits.
    """

    def __init__(
        self,
        *,
        cwd: str | os.PathLike[str] = PROJECT_ROOT,
        python: str | os.PathLike[str] | None = None,
        project: str = "egress-proxies",
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        rpc_timeout: float = 60.0,
        start_timeout: float = 30.0,
        module: str = HOST_MODULE,
    ) -> None:
        self.module = module
        self.cwd = Path(cwd)
        self.python = Path(python) if python else default_python()
        self.project = project
        self.config: dict[str, Any] = dict(config or {})
        self.extra_env = dict(env or {})
        self.rpc_timeout = rpc_timeout
        self.start_timeout = start_timeout
        self._own_log_dir: tempfile.TemporaryDirectory[str] | None = None
        if log_path is None:
            self._own_log_dir = tempfile.TemporaryDirectory(prefix="provider-log-")
            log_path = Path(self._own_log_dir.name) / "provider.log"
        self.log_path = Path(log_path)
        self.port: int | None = None
        self.supports_preview = False
        self.accept_secrets = False
        self._proc: Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None
        self._stub: provider_pb2_grpc.ResourceProviderStub | None = None
        self._drain: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        if self._proc is not None:
            return self
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # Like the engine: project name and stack config in the environment. PYTHONPATH is
        # dropped so the provider imports the project only through its working directory.
        env["PULUMI_PROJECT"] = self.project
        # As the engine sets it from Pulumi.yaml's runtime options.
        env["PULUMI_RUNTIME_VIRTUALENV"] = str(self.python.parent.parent)
        env["PULUMI_CONFIG"] = json.dumps({k: _config_string(v) for k, v in self.config.items()})
        env.update(self.extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = Popen(
                [str(self.python), "-c", _LAUNCHER, str(os.getpid()), self.module],
                cwd=self.cwd,
                env=env,
                stdin=DEVNULL,
                stdout=PIPE,
                stderr=log,
            )
        try:
            self.port = self._read_port()
            self._channel = grpc.insecure_channel(
                f"127.0.0.1:{self.port}", options=_GRPC_CHANNEL_OPTIONS
            )
            grpc.channel_ready_future(self._channel).result(timeout=self.start_timeout)
            self._stub = provider_pb2_grpc.ResourceProviderStub(self._channel)
            self.configure(self.config)
        except BaseException:
            self.close()
            raise
        return self

    def _read_port(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout
        ready, _, _ = select.select([out], [], [], self.start_timeout)
        line = out.readline() if ready else b""
        if not line.strip().isdigit():
            raise RuntimeError(
                f"dynamic provider did not print its port (got {line!r}); log:\n{self.log_text()}"
            )
        # A provider's print() goes to stdout: keep draining it so the pipe never fills.
        self._drain = threading.Thread(target=_copy_to_log, args=(out, self.log_path), daemon=True)
        self._drain.start()
        return int(line)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._stub = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._drain is not None:
                self._drain.join(timeout=5)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def log_text(self) -> str:
        """Everything the provider wrote to stderr and stdout so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- the ResourceProvider calls --------------------------------------------------------

    def configure(self, config: Mapping[str, Any] | None = None) -> None:
        """Configure as the engine does. A provider already unpickled keeps its old config."""
        values = dict(config or {})
        response = self._call(
            "Configure",
            provider_pb2.ConfigureRequest(
                variables={k: _config_string(v) for k, v in values.items()},
                args=_to_struct(values),
                acceptSecrets=True,
                acceptResources=True,
            ),
        )
        self.supports_preview = response.supportsPreview
        self.accept_secrets = response.acceptSecrets

    def check(self, urn: str, olds: Mapping[str, Any], news: Mapping[str, Any]) -> CheckResponse:
        response = self._call(
            "Check",
            provider_pb2.CheckRequest(
                **_names(urn),
                olds=_to_struct(olds),
                news=_to_struct(news),
            ),
        )
        failures = [(f.property, f.reason) for f in response.failures]
        return CheckResponse(_from_struct(response.inputs), failures)

    def diff(
        self,
        id: str,
        urn: str,
        olds: Mapping[str, Any],
        news: Mapping[str, Any],
        *,
        old_inputs: Mapping[str, Any] | None = None,
    ) -> DiffResponse:
        """`olds` are the old outputs (state), `news` the new checked inputs."""
        response = self._call(
            "Diff",
            provider_pb2.DiffRequest(
                id=id,
                **_names(urn),
                olds=_to_struct(olds),
                news=_to_struct(news),
                old_inputs=_to_struct(old_inputs if old_inputs is not None else olds),
            ),
        )
        changes: dict[int, Literal["unknown", "none", "some"]] = {
            provider_pb2.DiffResponse.DIFF_UNKNOWN: "unknown",
            provider_pb2.DiffResponse.DIFF_NONE: "none",
            provider_pb2.DiffResponse.DIFF_SOME: "some",
        }
        return DiffResponse(
            changes=changes[response.changes],
            replaces=list(response.replaces),
            stables=list(response.stables),
            delete_before_replace=response.deleteBeforeReplace,
        )

    def create(self, urn: str, props: Mapping[str, Any], preview: bool = False) -> CreateResponse:
        if preview and not self.supports_preview:
            # The engine does not call a provider without preview support: inputs become state.
            return CreateResponse("", _from_struct(_to_struct(props)))
        if not preview:
            _reject_unknowns("Create", props)
        response = self._call(
            "Create",
            provider_pb2.CreateRequest(
                **_names(urn),
                properties=_to_struct(props),
                preview=preview,
            ),
        )
        return CreateResponse(response.id, _from_struct(response.properties))

    def read(
        self,
        id: str,
        urn: str,
        props: Mapping[str, Any],
        *,
        inputs: Mapping[str, Any] | None = None,
    ) -> ReadResponse:
        """`props` are the last known outputs (state), as in a refresh."""
        response = self._call(
            "Read",
            provider_pb2.ReadRequest(
                id=id,
                **_names(urn),
                properties=_to_struct(props),
                inputs=_to_struct(inputs) if inputs is not None else None,
            ),
        )
        read_inputs = _from_struct(response.inputs) if response.HasField("inputs") else None
        return ReadResponse(response.id, _from_struct(response.properties), read_inputs)

    def update(
        self,
        id: str,
        urn: str,
        olds: Mapping[str, Any],
        news: Mapping[str, Any],
        preview: bool = False,
        *,
        old_inputs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Returns the new outputs. `olds` are the old outputs, `news` the new inputs."""
        if preview and not self.supports_preview:
            return _from_struct(_to_struct(news))
        if not preview:
            _reject_unknowns("Update", news)
        response = self._call(
            "Update",
            provider_pb2.UpdateRequest(
                id=id,
                **_names(urn),
                olds=_to_struct(olds),
                news=_to_struct(news),
                preview=preview,
                old_inputs=_to_struct(old_inputs if old_inputs is not None else olds),
            ),
        )
        return _from_struct(response.properties)

    def delete(
        self,
        id: str,
        urn: str,
        props: Mapping[str, Any],
        *,
        old_inputs: Mapping[str, Any] | None = None,
    ) -> None:
        """`props` are the resource's outputs (state)."""
        self._call(
            "Delete",
            provider_pb2.DeleteRequest(
                id=id,
                **_names(urn),
                properties=_to_struct(props),
                old_inputs=_to_struct(old_inputs if old_inputs is not None else props),
            ),
        )

    def _call(self, method: str, request: Any) -> Any:
        if self._stub is None:
            raise RuntimeError("provider process is not running; use start() or `with`")
        try:
            return getattr(self._stub, method)(request, timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"{method}: provider process exited ({self._proc.returncode}); "
                    f"log:\n{self.log_text()}"
                ) from err
            code: grpc.StatusCode = err.code()
            raise ProviderError(method, code, err.details() or "") from None


# -- value conversion ----------------------------------------------------------------------


def _engine_value(value: Any) -> Any:
    """What the engine marshals for a provider with acceptSecrets=False: secrets unwrapped."""
    if rpc.is_rpc_secret(value):
        return _engine_value(rpc.unwrap_rpc_secret(value))
    if isinstance(value, Unknown):
        return UNKNOWN
    if isinstance(value, Mapping):
        return {str(k): _engine_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_engine_value(v) for v in value]
    return value


def _to_struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(_engine_value(props))
    return struct


def _from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    # Plain python values: every number is a float; unknowns stay the UNKNOWN string.
    plain: dict[str, Any] = json_format.MessageToDict(struct)
    return plain


def _contains_unknown(value: Any) -> bool:
    value = _engine_value(value)
    if value == UNKNOWN:
        return True
    if isinstance(value, dict):
        return any(_contains_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_unknown(v) for v in value)
    return False


def _reject_unknowns(method: str, props: Mapping[str, Any]) -> None:
    # The engine never sends unknowns outside a preview.
    if _contains_unknown(dict(props)):
        raise ValueError(f"{method} outside a preview with unknown values: {dict(props)!r}")


def _config_string(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class _Names(TypedDict):
    urn: str
    name: str
    type: str


def _names(urn: str) -> _Names:
    """urn, name and type fields as the engine fills them in every request."""
    parts = urn.split("::")
    type_ = parts[-2].split("$")[-1] if len(parts) >= 4 else ""
    return {"urn": urn, "name": parts[-1], "type": type_}


def _last_exception(details: str) -> tuple[str, str]:
    """("ValueError", "message") from a formatted traceback; the whole text otherwise."""
    lines = details.rstrip("\n").splitlines()
    if not lines or not lines[0].startswith("Traceback"):
        return "", details.strip()
    # The exception text starts after the last indented (frame) line.
    start = max((i for i, line in enumerate(lines) if line.startswith(" ")), default=0) + 1
    text = "\n".join(lines[start:])
    exc_type, sep, message = text.partition(": ")
    return (exc_type, message) if sep else (text, "")


def _copy_to_log(pipe: IO[bytes], log_path: Path) -> None:
    with open(log_path, "ab", buffering=0) as log:
        for line in iter(pipe.readline, b""):
            log.write(line)


def default_python() -> Path:
    """The project venv's interpreter (what the engine would find via the virtualenv)."""
    return DEFAULT_PYTHON if DEFAULT_PYTHON.exists() else Path(sys.executable)
