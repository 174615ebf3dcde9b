"""A tunnel's bytes, moved between two transports by protocol callbacks: no
task, no stream object and no copy beyond the one the transports make. Each
side's write buffer pauses the other side's reading (so a slow reader never
makes the gateway hold more than a write buffer per direction), a half close
is passed on, and either side closing closes the other once its buffer is out.

The transports come from the handshake (server.py and upstream.py), whose
protocols are swapped for these with `transport.set_protocol`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# Per direction: a write buffer above HIGH pauses the reading side until it is
# below LOW. Large enough to keep a loopback or LAN path full.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class Tunnel:
    """Both ends of one tunnel and what it moved."""

    def __init__(
        self,
        client: asyncio.Transport,
        upstream: asyncio.Transport,
        *,
        on_close: Callable[[Tunnel], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.up = 0  # bytes client -> upstream
        self.down = 0
        self.last_active = clock()
        self.closed = False
        self._clock = clock
        self._on_close = on_close
        self._transports = (client, upstream)
        self.client = _End(self, client, upstream, upward=True)
        self.upstream = _End(self, upstream, client, upward=False)
        for transport in (client, upstream):
            transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)

    def start(self, to_upstream: bytes = b"", to_client: bytes = b"") -> None:
        """Swaps the protocols in and sends what either side sent early."""
        self.client.transport.set_protocol(self.client)
        self.upstream.transport.set_protocol(self.upstream)
        if to_upstream:
            self.client.data_received(to_upstream)
        if to_client:
            self.upstream.data_received(to_client)
        for end in (self.client, self.upstream):
            if end.transport.is_closing():
                self.close()
                return
            end.transport.resume_reading()

    def idle_for(self) -> float:
        return self._clock() - self.last_active

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for transport in self._transports:
            transport.close()
        on_close, self._on_close = self._on_close, _nothing
        on_close(self)

    def abort(self) -> None:
        for transport in self._transports:
            transport.abort()
        self.close()


def _nothing(_: Tunnel) -> None:
    pass


class _End(asyncio.Protocol):
    def __init__(
        self, tunnel: Tunnel, transport: asyncio.Transport, peer: asyncio.Transport, *, upward: bool
    ) -> None:
        self.tunnel = tunnel
        self.transport = transport
        self.peer = peer
        self.upward = upward
        self.ended = False  # this side sent EOF

    def data_received(self, data: bytes) -> None:
        tunnel = self.tunnel
        if self.upward:
            tunnel.up += len(data)
        else:
            tunnel.down += len(data)
        tunnel.last_active = tunnel._clock()
        self.peer.write(data)

    def eof_received(self) -> bool:
        # A half close is passed on; the tunnel ends when both sides are done.
        self.ended = True
        other = self.tunnel.upstream if self.upward else self.tunnel.client
        if other.ended or not self.peer.can_write_eof() or self.peer.is_closing():
            self.tunnel.close()
            return False
        self.peer.write_eof()
        return True

    def pause_writing(self) -> None:
        self.peer.pause_reading()

    def resume_writing(self) -> None:
        if not self.peer.is_closing():
            self.peer.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.tunnel.close()
        # No cycle left for the garbage collector: a busy gateway opens thousands
        # of tunnels a second, and cycles make its young collections long pauses.
        del self.tunnel, self.peer, self.transport


__all__ = ["HIGH_WATER", "LOW_WATER", "Tunnel"]
