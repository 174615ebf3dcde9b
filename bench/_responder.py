"""The bench's CONNECT responder on uvloop: many loopback ports, 200 to every
CONNECT, the tunnel held until the prober closes it (what
tests/support/responders.py does, whose protocol asserts asyncio's own
transport class and so cannot run on uvloop). At 5,000 probes a second the
default loop's responder would be the bottleneck, not the engine measured.

    python -m bench._responder --ports N   # prints the ports as JSON; serves until stdin closes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import uvloop

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


class _Tunnel(asyncio.Protocol):
    def __init__(self) -> None:
        self._head = b""
        self._transport: Any = None  # uvloop's, no asyncio.Transport subclass

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._head += data
        if b"\r\n\r\n" in self._head:
            self._transport.write(ESTABLISHED)
            # Held until the prober closes it, as squid holds a tunnel. (Closed
            # from this side, tried: the TIME_WAITs then on this side, about
            # 15 % of SYNs went unanswered a while at 50,000 probes a round.)


async def _serve(ports: int) -> None:
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(_Tunnel, "127.0.0.1", 0, backlog=1024) for _ in range(ports)
    ]
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()


def main() -> None:
    parser = argparse.ArgumentParser(description="a CONNECT responder on many loopback ports")
    parser.add_argument("--ports", type=int, default=100)
    uvloop.run(_serve(parser.parse_args().ports))


if __name__ == "__main__":
    main()
