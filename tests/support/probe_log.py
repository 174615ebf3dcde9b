"""CONNECT responders that log when each one was probed: one loopback port per
proxy, served by an event loop on a thread of the test's process, each
accepted connection noted with its time (time.monotonic(), the test's
clock) and answered `200 Connection established`, the tunnel held until the
prober closes it. Probes are counted here, at the proxies, whoever sent them.

    log = ProbeLog.start(16)
    ... replicas probe 127.0.0.1:log.ports[i] ...
    log.between(port, since, until)   # probe times of one port in [since, until)
    log.stop()
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import Any

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


class _Tunnel(asyncio.Protocol):
    def __init__(self, log: ProbeLog, port: int) -> None:
        self._log, self._port = log, port
        self._head = b""
        self._transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._log.note(self._port)

    def data_received(self, data: bytes) -> None:
        self._head += data
        if b"\r\n\r\n" in self._head:
            self._transport.write(ESTABLISHED)
            self._head = b""


class ProbeLog:
    def __init__(self) -> None:
        self.ports: list[int] = []
        self._times: dict[int, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @classmethod
    def start(cls, count: int) -> ProbeLog:
        log = cls()
        log._thread.start()
        asyncio.run_coroutine_threadsafe(log._listen(count), log._loop).result(10)
        return log

    async def _listen(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(count):
            port_box: list[int] = []

            def tunnel(box: list[int] = port_box) -> _Tunnel:
                return _Tunnel(self, box[0])

            server = await loop.create_server(tunnel, "127.0.0.1", 0)
            port_box.append(int(server.sockets[0].getsockname()[1]))
            self._servers.append(server)
            self.ports.append(port_box[0])

    def note(self, port: int) -> None:
        with self._lock:
            self._times[port].append(time.monotonic())

    def between(self, port: int, since: float, until: float = float("inf")) -> list[float]:
        with self._lock:
            return [t for t in self._times[port] if since <= t < until]

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
