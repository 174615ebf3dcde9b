"""The server side of bench/discovery_leases.py: the real app on a stand-in
health source that calls every proxy healthy (`serve`, run as `python -m
bench.discovery_leases --serve`), the lease book alone (`book_only`, run as
`--book`), and starting, pinning and stopping such processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class _AlwaysHealthy:
    """A health source with every proxy healthy and nothing probed."""

    def __init__(self) -> None:
        from health.model import Health, ProxyHealth

        self._health = Health.HEALTHY
        self._states: dict[str, ProxyHealth] = {}
        self._make = ProxyHealth

    def set_fleet(self, endpoints: Iterable[Any]) -> None:
        self._states = {
            e.name: self._make(e.name, self._health, 1.0, None, None) for e in endpoints
        }

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def health(self, name: str) -> Any:
        return self._states.get(name)

    def verdict(self, name: str) -> Any:
        return self._health if name in self._states else None

    def all(self) -> list[Any]:
        return list(self._states.values())

    def report_error(self, name: str, error: str) -> None:
        pass

    def take_changed(self) -> list[Any]:
        return []  # never probed: every proxy keeps the health it started with

    async def probe_now(self, name: str) -> Any:
        return self._states[name]

    def probe_targets(self) -> list[tuple[str, bool]]:
        return []


def serve(fleet: Path, db: str, port: int, cpu: int | None, profile: Path | None = None) -> int:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # threads started from here inherit it
    from discovery import logs
    from discovery.cli import run_server
    from discovery.database import parse_database
    from discovery.service import Service
    from discovery.settings import Settings

    logs.configure()
    settings = Settings(
        listen_host="127.0.0.1", listen_port=port, db=parse_database(db), fleet_files=(fleet,)
    )
    service = Service(settings, health_factory=lambda _listener, _registry: _AlwaysHealthy())
    service.open()
    if profile is None:
        return run_server(service)
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(run_server, service)
    finally:
        profiler.dump_stats(profile)


def book_only(
    fleet: Path, db: Path, clients: int, seconds: float, warmup: float, cpu: int | None
) -> None:
    """The lease book and its durable store without HTTP: the same grant+release
    pairs from `clients` concurrent tasks; prints one JSON line."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import resource

    from prometheus_client import CollectorRegistry

    from discovery.book.rules import Terms
    from discovery.fleet import FleetSource
    from discovery.metrics import Metrics
    from discovery.selection import Selector
    from discovery.sqlite.backend import SqliteBackend

    async def run() -> dict[str, Any]:
        # The service's own wiring of the book and its store, without the service.
        backend = SqliteBackend(db, Terms(max_ttl=300, cooldown=600, probe_interval=10))
        backend.open()
        book = await backend.start(
            FleetSource(path=fleet).load(), _AlwaysHealthy(), Metrics(CollectorRegistry())
        )
        anywhere = Selector()
        pair_ms: list[float] = []
        start = time.perf_counter()
        measure_from, end = start + warmup, start + warmup + seconds
        usage: list[Any] = []

        async def client() -> None:
            while (t0 := time.perf_counter()) < end:
                lease = await book.grant("bench", ttl=None, selector=anywhere, host=None)
                await book.release(lease.id)
                t1 = time.perf_counter()
                if t0 >= measure_from and t1 <= end:
                    pair_ms.append((t1 - t0) * 1000)

        async def sample() -> None:
            await asyncio.sleep(warmup)
            usage.append(resource.getrusage(resource.RUSAGE_SELF))

        sampler = asyncio.get_running_loop().create_task(sample())
        await asyncio.gather(*(client() for _ in range(clients)))
        await sampler
        after = resource.getrusage(resource.RUSAGE_SELF)
        await backend.stop()
        cpu_s = (after.ru_utime - usage[0].ru_utime) + (after.ru_stime - usage[0].ru_stime)
        return {"pairs": len(pair_ms), "pair_ms": pair_ms, "cpu": cpu_s / seconds}

    use_uvloop()
    print(json.dumps(asyncio.run(run())))


def write_fleet(path: Path, proxies: int) -> None:
    entries = [
        {
            "name": f"p{i}",
            "id": f"proxy-{i:010x}",
            "provider": "bench",
            "type": "external",
            "zone": None,
            "host": "127.0.0.1",
            "port": 3128,
            "labels": {},
            "auth": {"username": "crawler", "password": f"pw{i}"},
        }
        for i in range(proxies)
    ]
    path.write_text(
        json.dumps({"version": 1, "project": "bench", "stack": "bench", "proxies": entries})
    )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    fleet: Path, db: str, log: Path, cpu: int | None, profile: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "bench.discovery_leases", "--serve"]
    command += ["--fleet", str(fleet), "--db", db, "--port", str(port)]
    if cpu is not None:
        command += ["--server-cpu", str(cpu)]
    if profile is not None:
        command += ["--profile", str(profile.resolve())]
    with log.open("ab") as out:
        server = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
    wait_ready(port, server)
    return server, port


def stop_servers(servers: list[subprocess.Popen[bytes]]) -> None:
    for server in servers:
        server.terminate()
    for server in servers:
        server.wait(timeout=30)


def pin_tree(root: int, cpu: int) -> None:
    """ROOT and every process below it on CPU (the postmaster's later children inherit it)."""
    from tests.support.pulumi_cli import descendants

    for pid in (root, *descendants(root)):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, {cpu})


# A busy process with a working set of its own (a table walked over and over),
# as a second replica is to the first when the two have one core between them.
_BUSY = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
table = {i: str(i) for i in range(2_000_000)}
print("ready", flush=True)
while True:
    sum(len(v) for v in table.values())
"""


@contextlib.contextmanager
def busy_beside(cpu: int) -> Iterator[None]:
    """A busy process on CPU for the block's time, ready when it starts."""
    busy = subprocess.Popen(
        [sys.executable, "-c", _BUSY, str(cpu)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert busy.stdout is not None
        if busy.stdout.readline().strip() != "ready":
            raise SystemExit(f"the busy process exited with {busy.wait()}")
        yield
    finally:
        busy.kill()
        busy.wait()


def use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not become ready in 60 s")
