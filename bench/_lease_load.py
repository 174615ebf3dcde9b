"""The load generator of bench/discovery_leases.py: a small HTTP/1.1 client
on asyncio's protocol layer (httpx would need more CPU per request than the
server and measure itself), one phase of closed- or open-loop pairs, and
what a phase measured."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench._proc import thread_cpu, tree_cpu

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


async def run_phase(
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
            for thread, cpu in thread_cpu(pid).items():
                total[thread] = total.get(thread, 0.0) + cpu
        return total

    async def sample_cpu() -> None:
        nonlocal threads_before, database_before
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        threads_before = all_threads()
        if database_pid is not None:
            database_before = tree_cpu(database_pid)

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
    database = tree_cpu(database_pid) - database_before if database_pid is not None else None
    threads = {k: v - threads_before.get(k, 0.0) for k, v in threads_after.items()}
    cpu = sum(threads.values()) / seconds
    for conn in connections:
        assert conn.transport is not None
        conn.transport.close()
    return PhaseResult(name, pairs, seconds, pair_ms, request_ms, errors, cpu, threads, database)


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def slow_commits(metrics: str) -> tuple[float, float, float]:
    """(commits, commits over 5 ms, over 10 ms) from the store's histogram."""
    name = "discovery_store_commit_duration_seconds"
    total = metric(metrics, f"{name}_count")
    return (
        total,
        total - metric(metrics, f'{name}_bucket{{le="0.005"}}'),
        total - metric(metrics, f'{name}_bucket{{le="0.01"}}'),
    )


async def scrape(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_plain("GET", "/metrics").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    data = await reader.read(-1)
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def first_grant(ports: list[int]) -> None:
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
