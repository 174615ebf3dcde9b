"""Running the discovery service in tests.

- :class:`FakeHealth`: a health source whose verdicts the test sets, for
  tests about lease rules rather than probing.
- :class:`ServerThread`: the real ASGI app under uvicorn on 127.0.0.1 in a
  thread of the test process (fast to start; state reachable for asserts).
- :class:`ServiceProcess`: `python -m discovery serve` as a subprocess with
  its log captured (restarts, SIGKILL, what the log holds).
- :func:`manifest` / :func:`write_fleet`: fleet manifests v1.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from discovery.app import create_app
from discovery.service import Service
from discovery.settings import Settings
from health.model import Health, HealthListener, ProxyEndpoint, ProxyHealth
from tests.support.ports import free_port as free_port  # (imported from here by many tests)

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# -- manifests -----------------------------------------------------------------------------


def proxy_entry(
    name: str,
    *,
    port: int = 3128,
    host: str = "127.0.0.1",
    provider: str = "corp",
    zone: str | None = None,
    labels: Mapping[str, str] | None = None,
    username: str | None = None,
    password: str | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "id": "proxy-" + hashlib.sha256(name.encode()).hexdigest()[:10],
        "provider": provider,
        "type": "external",
        "zone": zone,
        "host": host,
        "port": port,
        "labels": dict(labels or {}),
    }
    if username is not None:
        entry["auth"] = {"username": username, "password": password}
    return entry


def manifest(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"version": 1, "project": "egress-proxies", "stack": "test", "proxies": list(entries)}


def write_fleet(
    path: Path, entries: Iterable[dict[str, Any]], *, as_stack_output: bool = False
) -> None:
    """Writes atomically (rename), as `pulumi stack output --json > file` through a temp file would."""
    document: dict[str, Any] = manifest(entries)
    if as_stack_output:
        document = {"fleet": document, "other": "output"}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


# -- a health source the test controls -----------------------------------------------------


class FakeHealth:
    """Satisfies discovery.health_source.HealthSource; every proxy starts as `initial`."""

    def __init__(self, listener: HealthListener, initial: Health = Health.HEALTHY) -> None:
        self.listener = listener
        self.initial = initial
        self.states: dict[str, ProxyHealth] = {}
        self.errors: list[tuple[str, str]] = []
        self.started = False
        self.targets: list[tuple[str, bool]] = [("example.com:443", False)]

    def set_fleet(self, endpoints: Iterable[ProxyEndpoint]) -> None:
        names = [e.name for e in endpoints]
        self.states = {
            n: self.states.get(n) or ProxyHealth(n, self.initial, 1.5, None, None) for n in names
        }

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def health(self, name: str) -> ProxyHealth | None:
        return self.states.get(name)

    def verdict(self, name: str) -> Health | None:
        state = self.states.get(name)
        return state.health if state is not None else None

    def all(self) -> list[ProxyHealth]:
        return list(self.states.values())

    def report_error(self, name: str, error: str) -> None:
        self.errors.append((name, error))

    def take_changed(self) -> list[ProxyHealth]:
        # Every state, each time: tests change `states` directly too, and a
        # replica writes only what differs from what it wrote.
        return self.all()

    async def probe_now(self, name: str) -> ProxyHealth:
        return self.states[name]

    def probe_targets(self) -> list[tuple[str, bool]]:
        return list(self.targets)

    def set(self, name: str, health: Health, error: str | None = None) -> None:
        """Changes a verdict and tells the listener, as the engine does."""
        self.states[name] = ProxyHealth(name, health, 1.5, error, datetime.now(UTC))
        self.listener.on_health_change(name, health)


# -- the app in a thread -------------------------------------------------------------------


@dataclass
class ServerThread:
    """uvicorn serving create_app(Service(...)) on 127.0.0.1, in a daemon thread."""

    settings: Settings
    initial: Health = Health.HEALTHY
    clock: Callable[[], float] = time.time
    fake: FakeHealth | None = None
    service: Service = field(init=False)
    _server: uvicorn.Server = field(init=False)
    _thread: threading.Thread = field(init=False)
    _loop: asyncio.AbstractEventLoop | None = None

    def __post_init__(self) -> None:
        def factory(listener: HealthListener, registry: CollectorRegistry) -> FakeHealth:
            self.fake = FakeHealth(listener, self.initial)
            return self.fake

        self.service = Service(self.settings, health_factory=factory, clock=self.clock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.listen_port}"

    def start(self) -> Self:
        self.service.open()
        config = uvicorn.Config(
            create_app(self.service),
            host="127.0.0.1",
            port=self.settings.listen_port,
            log_config=None,
            access_log=False,
            lifespan="on",
            backlog=4096,
        )
        self._server = uvicorn.Server(config)

        def run() -> None:
            asyncio.run(self._serve())

        self._thread = threading.Thread(target=run, name="discovery-test-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the discovery app did not start")
            time.sleep(0.01)
        return self

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve()

    def call(self, fn: Callable[[], T]) -> T:
        """Runs fn on the server's event loop (where all lease state lives) and returns its result."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def settings_for(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "listen_host": "127.0.0.1",
        "listen_port": free_port(),
        "db": tmp_path / "leases.db",
        "fleet_files": (tmp_path / "fleet.json",),
        "probe_interval": 0.5,
        "file_poll": 0.1,
    }
    values.update(overrides)
    return Settings(**values)


# -- the service as a subprocess -----------------------------------------------------------


class ServiceProcess:
    """`python -m discovery serve ARGS` with stderr (the JSON log) kept in a file."""

    def __init__(
        self,
        args: list[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        fd_limit: int | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.args = args
        self.cwd = cwd  # `--stack` runs `pulumi stack output` here
        self.log_path = log_path
        self.fd_limit = fd_limit  # RLIMIT_NOFILE, soft and hard (`ulimit -n`)
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        listen = args[args.index("--listen") + 1]
        self.url = f"http://{listen}"

    def start(self, *, wait_ready: bool = True, timeout: float = 20.0) -> Self:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "discovery", "serve", *self.args],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=None if self.fd_limit is None else self._limit_fds,
            )
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def _limit_fds(self) -> None:  # in the child, before exec
        assert self.fd_limit is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.fd_limit, self.fd_limit))

    def wait_ready(self, timeout: float = 20.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"discovery exited with {self.process.returncode}:\n{self.log()}"
                )
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"discovery not ready in {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL, the way a crash or the OOM killer ends it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                lines.append({"event": "(not json)", "line": line})
        return lines


def proxies(client: httpx.Client) -> dict[str, dict[str, Any]]:
    """GET /v1/proxies, by name."""
    answer = client.get("/v1/proxies")
    answer.raise_for_status()
    return {p["name"]: p for p in answer.json()["proxies"]}


def all_healthy(http: httpx.Client, names: set[str]) -> bool:
    """The service lists exactly NAMES, every one healthy."""
    listed = proxies(http)
    return set(listed) == names and all(p["health"] == "healthy" for p in listed.values())


def api_client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            if what is not None:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            raise AssertionError(f"condition not met in {timeout} s")
        time.sleep(interval)


# -- the app in this process, without a socket ----------------------------------------------


@contextlib.asynccontextmanager
async def app_client(
    settings: Settings, *, client: tuple[str, int] = ("192.0.2.7", 40000)
) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    """create_app(Service(settings)) with a FakeHealth, started on the running
    event loop and called through httpx.ASGITransport as from `client`: the
    real ASGI app, every layer of it, in the test's own process and loop."""

    def factory(listener: HealthListener, registry: CollectorRegistry) -> FakeHealth:
        return FakeHealth(listener)

    service = Service(settings, health_factory=factory)
    service.open()
    app = create_app(service)
    await service.start()
    try:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://discovery") as http:
            yield http, service
    finally:
        await service.stop()
        service.close()
