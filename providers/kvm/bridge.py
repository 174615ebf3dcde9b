"""A private local unix socket whose connections are carried to the host's
libvirt socket, each over its own SSH streamlocal channel, so libvirt-python
can connect with ``qemu+unix:///system?socket=PATH``."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
from collections.abc import Callable

import paramiko

from providers.kvm.rundir import SOCKET, private_dir

log = logging.getLogger("kvm")
CHUNK = 256 * 1024
PACKET = 32 * 1024  # what sshd accepts per channel packet


def _send_all(chan: paramiko.Channel, data: bytes) -> None:
    """Like ``chan.sendall`` without its copy of the rest of the buffer after
    every packet (quadratic in the buffer size; a third of upload time)."""
    view = memoryview(data)
    while view:
        sent = chan.send(bytes(view[:PACKET]))
        view = view[sent:]


class SocketBridge:
    def __init__(self, open_channel: Callable[[], paramiko.Channel], label: str) -> None:
        self._open_channel = open_channel
        self._label = label
        # A 0700 directory: only this user can connect to the host's libvirt.
        self._dir = private_dir("egress-libvirt-")
        self.path = os.path.join(self._dir, SOCKET)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(16)
        self._closed = threading.Event()
        self._pairs: list[tuple[socket.socket, paramiko.Channel]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"bridge {label}", daemon=True
        )
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.path}"

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._server.accept()
            except OSError:
                return
            try:
                chan = self._open_channel()
            except Exception as error:  # the libvirt client then sees EOF and reports it
                log.debug("%s bridge: channel open failed: %s", self._label, error)
                local.close()
                continue
            with self._lock:
                self._pairs.append((local, chan))
            for source, sink in ((self._local_to_chan, "up"), (self._chan_to_local, "down")):
                threading.Thread(
                    target=source,
                    args=(local, chan),
                    name=f"bridge {self._label} {sink}",
                    daemon=True,
                ).start()

    @staticmethod
    def _local_to_chan(local: socket.socket, chan: paramiko.Channel) -> None:
        try:
            while data := local.recv(CHUNK):
                _send_all(chan, data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError, EOFError):
                chan.shutdown_write()

    @staticmethod
    def _chan_to_local(local: socket.socket, chan: paramiko.Channel) -> None:
        try:
            while data := chan.recv(CHUNK):
                local.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                local.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        # shutdown() wakes the blocked accept(); close() alone does not on Linux.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for local, chan in pairs:
            with contextlib.suppress(OSError):
                local.close()
            chan.close()
        shutil.rmtree(self._dir, ignore_errors=True)
