"""One SSH + libvirt connection per host per process, shared by every
resource and thread, opened lazily, re-opened when dropped, closed at exit.

Providers are pickled into Pulumi state, so they hold a :class:`HostAccess`
and ask :func:`connect` for the live connection inside each method.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import libvirt
import paramiko
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from providers.kvm.access import HostAccess
from providers.kvm.bridge import SocketBridge
from providers.kvm.errors import HostUnreachable, LibvirtSocketError, LibvirtUnavailable
from providers.kvm.openssh import ForwardFailed, fell_back, forwarded_libvirt
from providers.kvm.ssh import SshSession
from providers.kvm.trace import Traced, error_label, wrap

log = logging.getLogger("kvm")
ATTEMPTS = 3

# libvirt prints every error it raises to stderr unless told otherwise.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


class HostConnection:
    def __init__(self, access: HostAccess) -> None:
        self.access = access
        self._lock = threading.RLock()
        self._ssh: SshSession | None = None
        self._bridge: SocketBridge | None = None
        self._conn: libvirt.virConnect | None = None
        self.opened = 0  # connections made so far (reconnects show here)

    @property
    def alive(self) -> bool:
        """Whether the current connection is up (never reconnects)."""
        with self._lock:
            return self._dead_reason() is None

    @property
    def context(self) -> str:
        return f"provider={self.access.provider} host={self.access.host}"

    def libvirt(self) -> Any:
        """The live libvirt connection (traced), re-opened if it dropped."""
        with self._lock:
            reason = self._dead_reason()
            if reason is None:
                return wrap(self._conn, self.context)
            if self._conn is not None:
                log.info("%s connection dropped (%s); reconnecting", self.context, reason)
                self._teardown()
            for attempt in Retrying(
                stop=stop_after_attempt(ATTEMPTS),
                wait=wait_exponential(multiplier=0.5, max=4),
                retry=retry_if_exception_type((HostUnreachable, LibvirtUnavailable)),
                reraise=True,
            ):
                with attempt:
                    self._open()
            return wrap(self._conn, self.context)

    @contextlib.contextmanager
    def bulk(self) -> Iterator[Any]:
        """A libvirt connection for one long transfer: through OpenSSH's own
        forward (openssh.py) when it can be made, else this connection."""
        self.libvirt()  # host key checked and the socket diagnosed by paramiko first
        try:
            with forwarded_libvirt(self.access) as conn:
                yield wrap(conn, self.context)
                return
        except ForwardFailed as error:
            fell_back(self.access, str(error))
        yield self.libvirt()

    def ssh(self) -> SshSession:
        """The SSH session alone (host checks, diagnosis); opened if needed."""
        with self._lock:
            if self._ssh is None or not self._ssh.active:
                self._teardown()
                self._ssh = SshSession(self.access)
            return self._ssh

    def _dead_reason(self) -> str | None:
        if self._ssh is None or self._conn is None:
            return "not connected"
        if not self._ssh.active:
            error = self._ssh.transport.get_exception()
            return f"ssh session closed: {error}" if error else "ssh session closed"
        try:
            if not self._conn.isAlive():
                return "libvirt connection closed"
        except libvirt.libvirtError as error:
            return f"libvirt: {error_label(error)}"
        return None

    def _open(self) -> None:
        a = self.access
        start = time.perf_counter()
        ssh = self.ssh()
        try:
            first = ssh.open_libvirt_channel()  # fails with a diagnosis, before libvirt tries
            first.close()
            bridge = SocketBridge(ssh.open_libvirt_channel, f"{a.provider}/{a.host}")
        except (LibvirtSocketError, paramiko.SSHException, OSError):
            self._teardown()
            raise
        try:
            conn = libvirt.open(bridge.uri)
        except libvirt.libvirtError as error:
            bridge.close()
            self._teardown()
            log.debug("%s libvirt open failed %s", self.context, error_label(error))
            raise LibvirtUnavailable(
                a.where,
                f"libvirt did not answer on {a.socket}: {error.get_error_message()}",
                "check that libvirtd runs and is healthy on the host",
            ) from None
        self._bridge, self._conn = bridge, conn
        self.opened += 1
        _open.add(self)
        log.debug(
            "%s connected user=%s socket=%s (%.0f ms)",
            self.context,
            a.user,
            a.socket,
            (time.perf_counter() - start) * 1000,
        )

    def _teardown(self) -> None:
        conn, bridge, ssh = self._conn, self._bridge, self._ssh
        self._conn = self._bridge = self._ssh = None
        # libvirt objects still referenced can hang interpreter exit in
        # virDomain.__del__ once the forward is gone: collect them first.
        gc.collect()
        if conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()
        if bridge is not None:
            bridge.close()
        if ssh is not None:
            ssh.close()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                log.debug("%s closing", self.context)
            self._teardown()
        _open.discard(self)


_pool: dict[HostAccess, HostConnection] = {}
_pool_lock = threading.Lock()
# Every open connection, pooled or not, held until closed and closed at exit:
# a libvirt connection whose bridge threads stop at interpreter shutdown would
# hang the final close in virConnect.__del__.
_open: set[HostConnection] = set()


def connect(access: HostAccess) -> HostConnection:
    """The process-wide connection of a host (not yet opened: it is lazy)."""
    with _pool_lock:
        connection = _pool.get(access)
        if connection is None:
            connection = _pool[access] = HostConnection(access)
        return connection


class LibvirtSource(Protocol):
    """What a resource needs of a host: its live libvirt connection."""

    def libvirt(self) -> Any: ...

    def bulk(self) -> contextlib.AbstractContextManager[Any]:
        """A libvirt connection for one long transfer (a base image upload)."""
        ...


Connector = Callable[[HostAccess], LibvirtSource]
_connector: Connector = connect


def source(access: HostAccess) -> LibvirtSource:
    """Where the kvm resources get a host's libvirt connection: from the
    connector in place, the pooled SSH connection unless ``use_connector``
    put another."""
    return _connector(access)


@contextlib.contextmanager
def use_connector(connector: Connector) -> Iterator[None]:
    """Within the block, every resource in this process reaches its hosts
    through ``connector``. The one way to change where hosts are reached: the
    provider process enters it at start for simulated hosts
    (providers.kvm.resource.start), fast tests for their in-memory host."""
    global _connector
    before, _connector = _connector, connector
    try:
        yield
    finally:
        _connector = before


def close_all() -> None:
    with _pool_lock:
        connections = {*_pool.values(), *_open}
        _pool.clear()
    for connection in connections:
        connection.close()


atexit.register(close_all)

__all__ = [
    "Connector",
    "HostConnection",
    "LibvirtSource",
    "Traced",
    "close_all",
    "connect",
    "source",
    "use_connector",
]
