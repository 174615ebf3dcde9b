"""The gateway bench's load: the target servers, the tunnel clients and
their meters, and the sampling of each process's CPU and memory
(bench/gateway.py runs the phases)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from bench._proc import cpu_times

ROOT = Path(__file__).resolve().parents[1]
HOLDER = "bench"
CHUNK = 256 * 1024  # the target's writes

# The contract's targets.
P50_OVERHEAD_MS = 1.0
P99_OVERHEAD_MS = 5.0
BULK_RATIO = 0.9
RATE_RATIO = 0.8
TUNNEL_KIB = 64.0


# -- the target (a subprocess: python -m bench.gateway --serve-targets SIZES) -------------------


class _Sender(asyncio.Protocol):
    """Sends `size` bytes as soon as connected, then closes; or with `hold`,
    keeps the connection open until the other side ends it."""

    def __init__(self, size: int, hold: bool) -> None:
        self.size = size
        self.hold = hold
        self.sent = 0
        self.paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        self.transport.set_write_buffer_limits(high=CHUNK, low=CHUNK // 4)
        self._send()

    def _send(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        while self.sent < self.size and not self.paused:
            n = min(CHUNK, self.size - self.sent)
            transport.write(_PAYLOAD if n == CHUNK else _PAYLOAD[:n])
            self.sent += n
        if self.sent >= self.size and not self.hold:
            transport.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._send()

    def eof_received(self) -> bool:
        return False  # closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


_PAYLOAD = b"x" * CHUNK


def serve_targets(sizes: list[int]) -> None:
    """Prints {"first": port, "hold": port, "bulk": {size: port}} and serves until killed."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        ports: dict[str, object] = {}

        async def listen(size: int, hold: bool) -> int:
            server = await loop.create_server(
                functools.partial(_Sender, size, hold), "127.0.0.1", 0, backlog=4096
            )
            return int(server.sockets[0].getsockname()[1])

        ports["first"] = await listen(1, False)
        ports["hold"] = await listen(1, True)
        ports["bulk"] = {str(size): await listen(size, False) for size in sizes}
        print(json.dumps(ports), flush=True)
        await asyncio.Event().wait()

    _use_uvloop()
    asyncio.run(run())


# -- the load generator --------------------------------------------------------------------------


class TunnelError(Exception):
    pass


@dataclass
class _Meter:
    """Bytes received through every tunnel while `on`."""

    on: bool = False
    bytes: int = 0


class _Client(asyncio.Protocol):
    """One tunnel: sends the CONNECT, reads the answer's head, then counts what
    the target sends. `first` resolves to the time its first byte came, `done`
    to the bytes received once the connection ended."""

    def __init__(self, request: bytes, meter: _Meter) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.meter = meter
        self.head = b""
        self.open = False
        self.received = 0
        self.first: asyncio.Future[float] = loop.create_future()
        self.done: asyncio.Future[int] = loop.create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if not self.open:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            if self.head[9:12] != b"200":
                self._end(TunnelError(f"answer {self.head[9:12].decode(errors='replace')}"))
                if self.transport is not None:
                    self.transport.close()
                return
            self.open = True
            data, self.head = self.head[end + 4 :], b""
            if not data:
                return
        if not self.received:
            self.first.set_result(time.perf_counter())
        self.received += len(data)
        if self.meter.on:
            self.meter.bytes += len(data)

    def eof_received(self) -> bool:
        self._end(None)
        return False  # closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)
        self.transport = None  # no cycle left for the collector

    def _end(self, exc: Exception | None) -> None:
        if not self.first.done():
            self.first.set_exception(exc or TunnelError("closed before the first byte"))
            self.first.exception()  # retrieved: its waiter may be gone
        if not self.done.done():
            if exc is None or self.open:
                self.done.set_result(self.received)
            else:
                self.done.set_exception(exc)
                self.done.exception()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


@dataclass(frozen=True)
class Side:
    name: str
    port: int  # where the CONNECT goes
    authorization: str  # Proxy-Authorization's value
    pid: int  # the process whose memory a held tunnel costs (squid, or the service)

    def request(self, target_port: int) -> bytes:
        target = f"127.0.0.1:{target_port}"
        return (
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            f"Proxy-Authorization: {self.authorization}\r\n\r\n"
        ).encode()


async def _open(side: Side, target_port: int, meter: _Meter) -> _Client:
    loop = asyncio.get_running_loop()
    request = side.request(target_port)
    _, client = await loop.create_connection(
        lambda: _Client(request, meter), "127.0.0.1", side.port
    )
    return client


@dataclass
class Result:
    side: str
    seconds: float
    count: int = 0  # tunnels completed in the window
    latency_ms: list[float] = field(default_factory=list)
    bytes: int = 0
    late: int = 0  # paced tunnels that started over 1 ms after their due time
    errors: Counter[str] = field(default_factory=Counter)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process in the window
    system: dict[str, float] = field(default_factory=dict)  # the kernel's share of it

    def merge(self, other: Result) -> None:
        self.seconds += other.seconds
        self.count += other.count
        self.latency_ms += other.latency_ms
        self.bytes += other.bytes
        self.late += other.late
        self.errors += other.errors
        for name, cpu in other.cpu.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu
            self.system[name] = self.system.get(name, 0.0) + other.system.get(name, 0.0)

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    def pct(self, q: float) -> float:
        if not self.latency_ms:
            return float("nan")
        ordered = sorted(self.latency_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def cpu_line(self, per: float, unit: str) -> str:
        """CPU per tunnel or MB of each process that used any, its system share in brackets."""
        scale = 1e6 / max(per, 1.0)
        return (
            ", ".join(
                f"{name} {cpu * scale:.0f} [{self.system.get(name, 0.0) * scale:.0f}]"
                for name, cpu in self.cpu.items()
                if cpu * scale >= 0.5
            )
            + f" us CPU [system] {unit}"
        )


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The generator's collector stays off in a window (its pauses would count
    as the proxies' latency), and collects in between."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


async def _window(
    result: Result,
    pids: dict[str, int],
    warmup: float,
    seconds: float,
    meter: _Meter | None = None,
) -> tuple[float, float]:
    """Starts the measurement window's clock: (its start, its end). CPU and
    bytes are sampled by a task at both ends."""
    start = time.perf_counter()
    measure_from, end = start + warmup, start + warmup + seconds

    async def sample() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        before = {name: cpu_times(pid) for name, pid in pids.items()}
        if meter is not None:
            meter.on, meter.bytes = True, 0
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        if meter is not None:
            meter.on = False
            result.bytes = meter.bytes
        for name, pid in pids.items():
            user, system = cpu_times(pid)
            result.cpu[name] = user + system - sum(before[name])
            result.system[name] = system - before[name][1]

    task = asyncio.get_running_loop().create_task(sample())
    _background.add(task)
    task.add_done_callback(_background.discard)
    return measure_from, end


_background: set[asyncio.Task[None]] = set()


async def _settle() -> None:
    while _background:
        await asyncio.gather(*_background)


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
