"""Benchmark: lease grant+release pairs per second and their latency, against
the same server's /healthz as the ceiling, in one run.

Run: scripts/bench discovery_leases      (or .venv/bin/python -m bench.discovery_leases)

The server is the real app (discovery.app on uvicorn, one worker, the SQLite
store with fsync on every commit) in its own process pinned to one CPU; the
fleet has --proxies proxies that a stand-in health source calls healthy (the
benchmark is about leases, not probes). The load generator runs in this
process, pinned to another CPU: --clients concurrent clients, each on its own
keep-alive connection, each looping POST /v1/leases then DELETE
/v1/leases/{id} (one pair) for --seconds after a warm-up. The /healthz phase
runs the same clients doing two GETs per loop: the framework's ceiling for a
"pair" of requests on this machine. Then an open-loop phase offers a fixed
rate (half the measured grant+release rate unless --rate says otherwise) and
reports its latency; then the lease book alone ("no HTTP"); then, unless
--no-postgres, grant+release against one and against two replicas sharing a
private PostgreSQL (scripts/postgres, a free port, removed afterwards): the
replicas on the server's CPU, PostgreSQL with the clients on theirs, so
that one replica and two have the same CPU and the second one's cost per
pair is its own, not four busy processes' scramble for two cores.
The last lines print the goals' figures as ratios within this run.

The client is a small HTTP/1.1 client on asyncio's protocol layer: httpx
would need more CPU per request than the server and measure itself. Its
garbage collector is off during each phase, so that its own pauses are not
counted as the server's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OPEN_LOOP_SHARE = 0.5  # the open-loop phase offers this share of the measured capacity


# -- the server side (a subprocess: python -m bench.discovery_leases --serve ...) ----------


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

    _use_uvloop()
    print(json.dumps(asyncio.run(run())))


# -- the load generator --------------------------------------------------------------------

_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request in flight at a time."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False  # uvicorn closes connections idle for 5 s

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiter is None:
            return
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[: end + 2])
        match = _LENGTH.search(head)
        length = int(match.group(1)) if match else 0
        total = end + 4 + length
        if len(self._buffer) < total:
            return
        body = bytes(self._buffer[end + 4 : total])
        del self._buffer[:total]
        waiter, self._waiter = self._waiter, None
        if not waiter.done():
            waiter.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection lost"))

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self._waiter


def _post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _plain(method: str, path: str) -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


@dataclass
class PhaseResult:
    name: str
    pairs: int
    seconds: float
    pair_ms: list[float]
    request_ms: list[float]
    errors: dict[str, int]
    server_cpu: float  # CPU seconds the server used per wall second
    threads: dict[str, float]  # CPU seconds per server thread during the phase
    database_cpu: float | None = None  # PostgreSQL's CPU seconds during the phase

    @property
    def database_us_per_pair(self) -> float | None:
        if self.database_cpu is None:
            return None
        return self.database_cpu / max(1, self.pairs) * 1e6

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds

    @property
    def cpu_us_per_pair(self) -> float:
        """Server CPU per pair: steadier than pairs/s on a machine shared with other work."""
        return self.server_cpu * self.seconds / max(1, self.pairs) * 1e6

    def line(self) -> str:
        def pct(values: list[float], q: float) -> float:
            if not values:
                return float("nan")
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return (
            f"{self.name:<15} {self.pairs_per_s:>9.0f} pairs/s  "
            f"pair p50 {pct(self.pair_ms, 0.5):6.2f} ms  p99 {pct(self.pair_ms, 0.99):7.2f} ms  "
            f"request p50 {pct(self.request_ms, 0.5):6.2f} ms  p99 {pct(self.request_ms, 0.99):7.2f} ms  "
            f"server CPU {self.server_cpu:4.2f} ({self.cpu_us_per_pair:5.0f} us/pair)  "
            f"errors {sum(self.errors.values())}"
            + (
                f"  PostgreSQL CPU {self.database_us_per_pair:5.0f} us/pair"
                if self.database_us_per_pair is not None
                else ""
            )
        )

    def summary(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "pairs_per_s": round(self.pairs_per_s, 1),
            "pair_p50_ms": round(statistics.median(self.pair_ms), 3) if self.pair_ms else None,
            "pair_p99_ms": round(sorted(self.pair_ms)[int(0.99 * len(self.pair_ms))], 3)
            if self.pair_ms
            else None,
            "request_p50_ms": round(statistics.median(self.request_ms), 3)
            if self.request_ms
            else None,
            "request_p99_ms": round(sorted(self.request_ms)[int(0.99 * len(self.request_ms))], 3)
            if self.request_ms
            else None,
            "server_cpu": round(self.server_cpu, 2),
            "server_cpu_us_per_pair": round(self.cpu_us_per_pair),
            "server_cpu_us_per_pair_by_thread": {
                name: round(cpu / max(1, self.pairs) * 1e6)
                for name, cpu in sorted(self.threads.items())
                if cpu > 0
            },
            "errors": self.errors,
            "database_cpu_us_per_pair": round(self.database_us_per_pair)
            if self.database_us_per_pair is not None
            else None,
        }


def _tree_cpu(root: int) -> float:
    """CPU seconds of ROOT, its live children and the children it reaped:
    PostgreSQL's postmaster and its backends."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == root:
            total += sum(int(f) for f in fields[11:15]) / ticks
        elif ppid == root:
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _cpu_seconds(pid: int) -> float:
    return sum(_thread_cpu(pid).values())


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (the event loop is the process's own name)."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        threads[name] = threads.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return threads


async def _phase(
    name: str,
    ports: list[int],
    clients: int,
    seconds: float,
    warmup: float,
    server_pids: list[int],
    leases: bool,
    rate: float | None = None,
    database_pid: int | None = None,
) -> PhaseResult:
    """`rate`: pairs per second offered in all (each client paced at rate/clients,
    open loop); None: every client starts its next pair as soon as one ends.
    Clients are spread over `ports` (one server each) round-robin."""
    loop = asyncio.get_running_loop()

    async def connect(index: int) -> _Connection:
        port = ports[index % len(ports)]
        _, conn = await loop.create_connection(_Connection, "127.0.0.1", port)
        return conn

    connections = [await connect(i) for i in range(clients)]
    pair_ms: list[float] = []
    request_ms: list[float] = []
    errors: dict[str, int] = {}
    pairs = 0
    start = time.perf_counter()
    measure_from = start + warmup
    end = measure_from + seconds
    grant = _post("/v1/leases", b'{"holder": "bench"}')
    healthz = _plain("GET", "/healthz")

    async def one_pair(conn: _Connection) -> tuple[bool, int, float]:
        """(second request ok, its status or -1 when the grant failed, end of the first)."""
        if leases:
            status, body = await conn.request(grant)
            t1 = time.perf_counter()
            if status != 201:
                errors[f"grant {status}"] = errors.get(f"grant {status}", 0) + 1
                return False, -1, t1
            lease_id = json.loads(body)["id"]
            status, _ = await conn.request(_plain("DELETE", f"/v1/leases/{lease_id}"))
            return status == 204, status, t1
        status, _ = await conn.request(healthz)
        t1 = time.perf_counter()
        status, _ = await conn.request(healthz)
        return status == 200, status, t1

    async def client(conn: _Connection, index: int) -> None:
        nonlocal pairs
        period = clients / rate if rate else 0.0
        due = start + period * index / clients  # spread the clients' phases evenly
        while True:
            if period:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                due += period
            if conn.closed:
                conn = await connect(index)
                connections.append(conn)
            t0 = time.perf_counter()
            if t0 >= end:
                return
            try:
                ok, status, t1 = await one_pair(conn)
            except ConnectionError:  # closed as idle just as this pair began
                errors["connection closed"] = errors.get("connection closed", 0) + 1
                continue
            if status == -1:
                await asyncio.sleep(0.01)
                continue
            t2 = time.perf_counter()
            if not ok:
                errors[f"second {status}"] = errors.get(f"second {status}", 0) + 1
            if t0 >= measure_from and t2 <= end:
                pairs += 1
                pair_ms.append((t2 - t0) * 1000)
                request_ms.append((t1 - t0) * 1000)
                request_ms.append((t2 - t1) * 1000)

    await asyncio.sleep(0)
    threads_before: dict[str, float] = {}
    database_before = 0.0

    def all_threads() -> dict[str, float]:
        total: dict[str, float] = {}
        for pid in server_pids:
            for thread, cpu in _thread_cpu(pid).items():
                total[thread] = total.get(thread, 0.0) + cpu
        return total

    async def sample_cpu() -> None:
        nonlocal threads_before, database_before
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        threads_before = all_threads()
        if database_pid is not None:
            database_before = _tree_cpu(database_pid)

    sampler = loop.create_task(sample_cpu())
    # The load generator's own collections would be counted as the server's
    # latency (a 17.8 ms full collection in one open-loop phase): none during
    # a phase; what a phase leaves is freed by reference counting anyway.
    gc.disable()
    try:
        await asyncio.gather(*(client(c, i) for i, c in enumerate(connections)))
        await sampler
    finally:
        gc.enable()
    threads_after = all_threads()
    database = _tree_cpu(database_pid) - database_before if database_pid is not None else None
    threads = {k: v - threads_before.get(k, 0.0) for k, v in threads_after.items()}
    cpu = sum(threads.values()) / seconds
    for conn in connections:
        assert conn.transport is not None
        conn.transport.close()
    return PhaseResult(name, pairs, seconds, pair_ms, request_ms, errors, cpu, threads, database)


def _fleet(path: Path, proxies: int) -> None:
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


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def _slow_commits(metrics: str) -> tuple[float, float, float]:
    """(commits, commits over 5 ms, over 10 ms) from the store's histogram."""
    name = "discovery_store_commit_duration_seconds"
    total = _metric(metrics, f"{name}_count")
    return (
        total,
        total - _metric(metrics, f'{name}_bucket{{le="0.005"}}'),
        total - _metric(metrics, f'{name}_bucket{{le="0.01"}}'),
    )


async def _scrape(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_plain("GET", "/metrics").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    data = await reader.read(-1)
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def _run(args: argparse.Namespace, port: int, server_pid: int) -> list[PhaseResult]:
    results = []
    for name, leases in (("healthz x2", False), ("grant+release", True)):
        results.append(
            await _phase(
                name, [port], args.clients, args.seconds, args.warmup, [server_pid], leases
            )
        )
    # Open loop: a fixed offered rate, by default half of what was just measured.
    rates = args.rate or [round(results[1].pairs_per_s * OPEN_LOOP_SHARE)]
    for rate in rates:
        before = _slow_commits(await _scrape(port))
        results.append(
            await _phase(
                f"paced {rate:.0f}/s",
                [port],
                args.clients,
                args.seconds,
                args.warmup,
                [server_pid],
                True,
                rate,
            )
        )
        # The disk's share of the tail: an fsync that stalls holds every
        # answer queued behind it (warm-up included in these counts).
        after = _slow_commits(await _scrape(port))
        total, over_5, over_10 = (a - b for a, b in zip(after, before, strict=True))
        print(
            f"{results[-1].name}: {total:.0f} commits, {over_5:.0f} over 5 ms, "
            f"{over_10:.0f} over 10 ms"
        )
    metrics = await _scrape(port)
    commits = _metric(metrics, "discovery_store_commit_duration_seconds_count")
    commit_sum = _metric(metrics, "discovery_store_commit_duration_seconds_sum")
    ops = _metric(metrics, "discovery_store_ops_total")
    if commits:
        print(
            f"store: {commits:.0f} commits, {ops / commits:.1f} ops per commit, "
            f"{commit_sum / commits * 1000:.2f} ms per commit (fsync included)"
        )
    return results


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(
    fleet: Path, db: str, log: Path, cpu: int | None, profile: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    command = [sys.executable, "-m", "bench.discovery_leases", "--serve"]
    command += ["--fleet", str(fleet), "--db", db, "--port", str(port)]
    if cpu is not None:
        command += ["--server-cpu", str(cpu)]
    if profile is not None:
        command += ["--profile", str(profile.resolve())]
    with log.open("ab") as out:
        server = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
    _wait_ready(port, server)
    return server, port


def _stop(servers: list[subprocess.Popen[bytes]]) -> None:
    for server in servers:
        server.terminate()
    for server in servers:
        server.wait(timeout=30)


async def _first_grant(ports: list[int]) -> None:
    """Waits until each server grants (on PostgreSQL the leader's first health
    flush must have landed), then gives the lease back."""
    loop = asyncio.get_running_loop()
    for port in ports:
        _, conn = await loop.create_connection(_Connection, "127.0.0.1", port)
        deadline = time.monotonic() + 30
        while True:
            status, body = await conn.request(_post("/v1/leases", b'{"holder": "warm"}'))
            if status == 201:
                await conn.request(_plain("DELETE", f"/v1/leases/{json.loads(body)['id']}"))
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"no grant from the server on port {port}: {status} {body!r}")
            await asyncio.sleep(0.2)
        assert conn.transport is not None
        conn.transport.close()


def _pin_tree(root: int, cpu: int) -> None:
    """ROOT and every process below it on CPU (the postmaster's later children inherit it)."""
    from tests.support.pulumi_cli import descendants

    for pid in (root, *descendants(root)):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, {cpu})


def _postgres_phases(
    args: argparse.Namespace, fleet: Path, tmp: Path, pinned: bool
) -> list[PhaseResult]:
    """grant+release with one replica, then two, on one PostgreSQL (a private
    server of scripts/postgres on a free port, removed afterwards). PINNED:
    the replicas share the server's CPU, as the SQLite server had it alone,
    and PostgreSQL shares the clients' CPU, so that one replica and two get
    the same CPU (what one more replica adds is then its own cost, not a
    scramble of four busy processes for two cores); else nothing is pinned."""
    port = _free_port()
    script = ROOT / "scripts" / "postgres"
    started = subprocess.run(
        [str(script), "start", "--port", str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    url = started.stdout.strip().splitlines()[-1]
    postmaster = int((ROOT / ".cache" / "postgres" / str(port) / "pid").read_text().split()[0])
    if pinned:
        _pin_tree(postmaster, args.client_cpu)
    cpus = os.sched_getaffinity(0)
    results = []
    servers: list[subprocess.Popen[bytes]] = []
    servers_ports: list[int] = []
    try:
        for count in (1, 2):
            while len(servers) < count:
                server, server_port = _start_server(
                    fleet,
                    url,
                    tmp / f"replica{len(servers)}.log",
                    args.server_cpu if pinned else None,
                )
                servers.append(server)
                servers_ports.append(server_port)
            ports = servers_ports[:count]
            asyncio.run(_first_grant(ports))
            if pinned:
                os.sched_setaffinity(0, {args.client_cpu})
            results.append(
                asyncio.run(
                    _phase(
                        f"pg {count} replica" + ("s" if count > 1 else ""),
                        ports,
                        args.clients,
                        args.seconds,
                        args.warmup,
                        [s.pid for s in servers[:count]],
                        True,
                        database_pid=postmaster,
                    )
                )
            )
    finally:
        os.sched_setaffinity(0, cpus)
        _stop(servers)
        subprocess.run([str(script), "remove", "--port", str(port)], cwd=ROOT, check=False)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--proxies", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--rate",
        type=float,
        action="append",
        metavar="PAIRS_PER_S",
        help="the open-loop phase's offered rate (repeatable; default: half the measured "
        "grant+release rate)",
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="skip the PostgreSQL replica phases"
    )
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run the server under cProfile (slower) and print where its time goes",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--book", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        sys.exit(serve(args.fleet, args.db, args.port, args.server_cpu, args.profile))
    if args.book:
        book_only(
            args.fleet, Path(args.db), args.clients, args.seconds, args.warmup, args.server_cpu
        )
        return

    if args.clients > args.proxies:
        parser.error("--clients must not exceed --proxies (every client holds one lease at a time)")
    cpus = os.sched_getaffinity(0)
    pinned = (
        args.server_cpu in cpus and args.client_cpu in cpus and args.server_cpu != args.client_cpu
    )
    with tempfile.TemporaryDirectory(prefix="discovery-bench-") as tmp_name:
        tmp = Path(tmp_name)
        fleet, db = tmp / "fleet.json", tmp / "leases.db"
        _fleet(fleet, args.proxies)
        server, port = _start_server(
            fleet,
            str(db),
            tmp / "server.log",
            args.server_cpu if pinned else None,
            args.profile,
        )
        try:
            if pinned:
                os.sched_setaffinity(0, {args.client_cpu})
            _use_uvloop()
            print(
                f"discovery_leases: {args.clients} clients, {args.proxies} proxies, "
                f"{args.seconds:.0f} s per phase after {args.warmup:.0f} s warm-up; server on "
                + (
                    f"CPU {args.server_cpu}, clients on CPU {args.client_cpu}"
                    if pinned
                    else "unpinned"
                )
            )
            results = asyncio.run(_run(args, port, server.pid))
        finally:
            _stop([server])
            os.sched_setaffinity(0, cpus)
        # The lease logic and the durable store alone, on the server's CPU.
        book_db = tmp / "book.db"
        command = [sys.executable, "-m", "bench.discovery_leases", "--book"]
        command += ["--fleet", str(fleet), "--db", str(book_db), "--clients", str(args.clients)]
        command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
        if pinned:
            command += ["--server-cpu", str(args.server_cpu)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        book = json.loads(done.stdout.splitlines()[-1])
        results.insert(
            2,
            PhaseResult(
                "no HTTP", book["pairs"], args.seconds, book["pair_ms"], [], {}, book["cpu"], {}
            ),
        )
        if not args.no_postgres:
            results += _postgres_phases(args, fleet, tmp, pinned)
    for result in results:
        print(result.line())
        busy = {n: c for n, c in sorted(result.threads.items()) if c > 0}
        if busy:
            print(
                "    server CPU per pair by thread: "
                + ", ".join(f"{n} {c / max(1, result.pairs) * 1e6:.0f} us" for n, c in busy.items())
            )
    if args.profile:
        import pstats

        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(25)
    _print_ratios(results)
    print(json.dumps([r.summary() for r in results]))


def _print_ratios(results: list[PhaseResult]) -> None:
    """The figures the goals are stated in, as ratios within this run."""
    by_name = {r.name: r for r in results}
    ceiling, leases = by_name["healthz x2"], by_name["grant+release"]
    ratio = leases.pairs_per_s / ceiling.pairs_per_s
    print(f"SQLite: grant+release at {ratio:.0%} of the /healthz ceiling (goal >= 70%)")
    for result in results:
        if result.name.startswith("paced"):
            p99 = result.summary()["pair_p99_ms"]
            print(f"open loop {result.name[6:]}: pair p99 {p99} ms (goal < 10 ms)")
    one, two = by_name.get("pg 1 replica"), by_name.get("pg 2 replicas")
    if one is not None:
        print(
            f"PostgreSQL: a replica's CPU per pair {one.cpu_us_per_pair:.0f} us, "
            f"{one.cpu_us_per_pair / leases.cpu_us_per_pair:.2f}x SQLite's "
            f"{leases.cpu_us_per_pair:.0f} us (goal <= 1.5x); PostgreSQL's own "
            f"{one.database_us_per_pair or 0:.0f} us"
        )
    if one is not None and two is not None:
        total_one = one.cpu_us_per_pair + (one.database_us_per_pair or 0)
        total_two = two.cpu_us_per_pair + (two.database_us_per_pair or 0)
        print(
            f"PostgreSQL: 2 replicas at {two.pairs_per_s / one.pairs_per_s:.2f}x one replica's "
            f"pairs/s; CPU per pair, replicas and PostgreSQL summed: {total_two:.0f} us with two, "
            f"{total_one:.0f} us with one ({total_two / total_one:.2f}x, goal <= 1.0x; "
            f"replicas {two.cpu_us_per_pair:.0f} against {one.cpu_us_per_pair:.0f}, "
            f"PostgreSQL {two.database_us_per_pair or 0:.0f} against "
            f"{one.database_us_per_pair or 0:.0f})"
        )


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
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


if __name__ == "__main__":
    main()
