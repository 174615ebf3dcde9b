"""Fake proxies and targets on 127.0.0.1, on the caller's asyncio loop.

    async with FakeProxy(answer=b"HTTP/1.1 200 OK\\r\\n\\r\\n", ports=3) as fake:
        ... probe 127.0.0.1:fake.ports[i] ...

A FakeProxy waits for a request head and then behaves as told:

- ``answer``: writes those bytes and keeps the connection open (a tunnel
  that carries nothing) until the client closes it, or closes it at once
  with ``close_after_answer``;
- ``silent``: accepts and never answers (a hung proxy);
- ``close``: closes without answering (EOF);
- ``reset``: drops the connection with a TCP RST.

It can listen on many ports at once; the benchmark runs one in its own process
(``python -m tests.support.responders --ports N``: prints the ports as a JSON
list on one line, serves until its standard input closes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import ssl
import struct
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

Behaviour = Literal["answer", "silent", "close", "reset"]
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


class _FakeProxyConnection(asyncio.Protocol):
    def __init__(self, owner: FakeProxy) -> None:
        self._owner = owner
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._owner.connections += 1
        self._owner.per_port[transport.get_extra_info("sockname")[1]] += 1
        self._owner.open.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._owner.open.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self._buffer += data
        if b"\r\n\r\n" not in self._buffer:
            return
        self._done = True
        owner, transport = self._owner, self._transport
        assert transport is not None
        if owner.record:
            owner.requests.append(self._buffer)
        if owner.behaviour == "answer":
            transport.write(owner.answer)
            if owner.close_after_answer:
                transport.close()
        elif owner.behaviour == "close":
            transport.close()
        elif owner.behaviour == "reset":
            # Linger 0: close() sends RST instead of FIN.
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()


class FakeProxy:
    def __init__(
        self,
        behaviour: Behaviour = "answer",
        *,
        answer: bytes = ESTABLISHED,
        ports: int = 1,
        close_after_answer: bool = False,
        record: bool = False,
        backlog: int = 1024,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.behaviour = behaviour
        self.answer = answer
        self.close_after_answer = close_after_answer
        self.record = record
        self.requests: list[bytes] = []
        self.connections = 0
        self.per_port: Counter[int] = Counter()  # connections by listening port
        self.open: set[asyncio.Transport] = set()
        self.ports: list[int] = []
        self._count = ports
        self._backlog = backlog
        self._servers: list[asyncio.Server] = []

    @property
    def port(self) -> int:
        return self.ports[0]

    async def start(self) -> Self:
        loop = asyncio.get_running_loop()
        for _ in range(self._count):
            server = await loop.create_server(
                lambda: _FakeProxyConnection(self), self.host, 0, backlog=self._backlog
            )
            self._servers.append(server)
            self.ports.append(int(server.sockets[0].getsockname()[1]))
        return self

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()
        for transport in [*self.open]:
            transport.abort()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _Holder(asyncio.Protocol):
    """Accepts and holds the connection; what a CONNECT target needs to be."""


class Target:
    """A TCP (optionally TLS) server that accepts and holds connections."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            _Holder,
            "127.0.0.1",
            0,
            ssl=self._ssl,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()


async def _serve(ports: int) -> None:
    fake = await FakeProxy(ports=ports).start()
    print(json.dumps(fake.ports), flush=True)
    # Serve until the parent closes our stdin (or dies).
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    await fake.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="a CONNECT responder on many loopback ports")
    parser.add_argument("--ports", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(_serve(args.ports))


@dataclass
class Responders:
    """Fake proxies (they answer CONNECT with 200) in a process of their own:
    `python -m tests.support.responders --ports N`, killed by stop()."""

    process: subprocess.Popen[str]
    ports: list[int]

    @classmethod
    def start(cls, count: int) -> Responders:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.responders", "--ports", str(count)],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        return cls(process, json.loads(process.stdout.readline()))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


if __name__ == "__main__":
    main()
