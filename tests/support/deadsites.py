"""Sites that never answer, on loopback, to send requests through a real squid
to: what a crawler meets on dead links and overloaded servers, and what must
not count against the proxy in between.

- SilentSite accepts connections and reads requests but never answers (a
  hung server): squid forwards a plain request and waits for the answer.
- UnreachableSite drops new connections (its accept queue is full, so the
  kernel drops their SYNs, as a firewall that drops packets would): squid's
  CONNECT to it waits for a TCP connection that never comes.
- TlsSite(context) speaks TLS with `context` (a certificate no client
  trusts) and closes after the handshake; TlsSite(None) resets every
  connection at the client's first bytes, its TLS handshake cut off.
- refused_port(): a port that refuses connections while it is held
  (squid's CONNECT to it is refused).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Self


class _Listening:
    """A loopback listener whose connections `_handle` takes, on a thread."""

    scheme = "http"

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.close()
        for conn in self._held:
            conn.close()


class SilentSite(_Listening):
    def _handle(self, conn: socket.socket) -> None:
        self._held.append(conn)  # kept open, never answered


class TlsSite(_Listening):
    scheme = "https"

    def __init__(self, context: ssl.SSLContext | None) -> None:
        self._context = context
        super().__init__()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        if self._context is None:
            # After the client's first bytes (its ClientHello: squid has opened
            # the tunnel by then; a reset before it races squid's own connect
            # and turns into squid's 503). SO_LINGER 0: close sends a reset.
            with contextlib.suppress(OSError):
                conn.recv(1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return
        try:
            with self._context.wrap_socket(conn, server_side=True):
                pass
        except OSError:  # the client refused the certificate, as it should
            conn.close()


class UnreachableSite:
    def __init__(self) -> None:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(0)
        self.port: int = self._server.getsockname()[1]
        # Fill the accept queue (Linux queues backlog + 1): never accepted, so
        # every later SYN is dropped and its connect() waits.
        self._fillers: list[socket.socket] = []
        for _ in range(2):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(filler)

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> UnreachableSite:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for filler in self._fillers:
            filler.close()
        self._server.close()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for the block's time: bound
    and never listening, so no other process can take it meanwhile. A port
    only found free and let go can be bound by the next server the suite
    starts (a CI run lost a "closed" probe target that way: the proxies were
    healthy through it)."""
    with socket.socket() as sock:  # no SO_REUSEADDR: a server's bind here fails
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
