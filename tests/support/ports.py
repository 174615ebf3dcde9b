"""Loopback ports for the servers the suite starts, handed out so that two
never meet.

A port found by binding to port 0 and let go is one of the kernel's ephemeral
ports: the kernel may give it again, to the next server the suite starts (this
worker's or another's) or to an outgoing connection, before the server it
was chosen for binds it. CI runs failed so (a gateway's port taken by a squid
started in between). These ports come from above the kernel's ephemeral
range, which it never picks from, in a slice of their own per pytest-xdist
worker, in turn: never one another worker hands out, never one this process
handed out lately, and still checked free by a bind.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LAST_PORT = 65535


def _slice() -> range:
    """This worker's ports: above the ephemeral range, split by worker."""
    ephemeral_last = int(_RANGE_FILE.read_text().split()[1])
    first = ephemeral_last + 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (_LAST_PORT + 1 - first) // max(1, workers)
    if size < 100:
        raise RuntimeError(f"too few ports above the ephemeral range ({_RANGE_FILE}) for the suite")
    start = first + worker * size
    return range(start, start + size)


class _Ports:
    """PORTS (this worker's slice, found on first use) in turn, passing
    over those FREE says are held."""

    def __init__(
        self, ports: range | None = None, free: Callable[[int], bool] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._ports = ports
        self._free = free or bindable
        self._next = 0

    def take(self) -> int:
        with self._lock:
            if self._ports is None:
                self._ports = _slice()
            for _ in range(len(self._ports)):
                port = self._ports[self._next % len(self._ports)]
                self._next += 1
                if self._free(port):
                    return port
        raise RuntimeError(f"no free port left in {self._ports}")


def bindable(port: int) -> bool:
    """Nothing holds 127.0.0.1:PORT now (a bind without SO_REUSEADDR works)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PORTS = _Ports()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, and that no other
    call in this run hands out while the server it is for starts."""
    return _PORTS.take()
