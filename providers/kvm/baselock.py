"""One writer per base image on a host: a lock volume beside the base.

Two stacks (or two `pulumi up`s) may need the same base on one host at the
same moment. The one that creates `<base>.lock` in the pool (libvirt's
volume create fails when the name exists: the one atomic step the pool
offers) downloads; the others wait until the marker appears and use the
cached base. The holder rewrites the lock's content every HEARTBEAT seconds,
so the volume's file keeps changing; a waiter that sees it unchanged for
STALE seconds of its own clock takes it for a downloader that died (a
killed `pulumi up`, a lost SSH connection), removes the lock and what it left
of the base, and takes over. No clock of two machines is compared: each
waiter measures the silence itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import Any

import libvirt

from providers.kvm.volumes import lookup_volume, upload, volume_xml

HEARTBEAT = 5.0  # seconds between the holder's rewrites of the lock
STALE_ENV = "EGRESS_PROXIES_BASE_LOCK_STALE"
# Seconds without a rewrite after which a waiter takes over (several heartbeats:
# a busy host or a slow SSH round trip must not look like a dead writer).
STALE = float(os.environ.get(STALE_ENV) or 45.0)
POLL = 1.0  # seconds between a waiter's looks
LOCK_SIZE = 256

Log = logging.LoggerAdapter[logging.Logger]


def lock_volume(base: str) -> str:
    return f"{base}.lock"


class LockLost(Exception):
    """The lock volume vanished while held (someone took it for stale)."""


def try_lock(conn: Any, pool: Any, name: str) -> bool:
    """Creates the lock volume; False when another writer holds it."""
    try:
        vol = pool.createXML(volume_xml(name, LOCK_SIZE, "raw"), 0)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_STORAGE_VOL_EXIST or (
            lookup_volume(pool, name) is not None
        ):
            return False
        raise
    _stamp(conn, vol)
    return True


def _stamp(conn: Any, vol: Any) -> None:
    """The lock's content: who holds it and a counter, so every write changes it."""
    text = f"{socket.gethostname()} pid {os.getpid()} at {time.time():.3f}\n"
    data = text.encode().ljust(LOCK_SIZE, b" ")[:LOCK_SIZE]
    upload(conn, vol, [data], len(data))


def fingerprint(vol: Any) -> str:
    """What changes when the holder rewrites the lock: the file's modification
    time as libvirt reports it (with its capacity and allocation as fallback)."""
    root = ET.fromstring(vol.XMLDesc(0))
    mtime = root.findtext("target/timestamps/mtime")
    return mtime or ET.tostring(root, encoding="unicode")


@contextlib.contextmanager
def held(conn: Any, pool: Any, name: str, log: Log) -> Iterator[None]:
    """While the block runs, a thread rewrites the lock every HEARTBEAT
    seconds; the lock volume is deleted at the end, whatever happens."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT):
            try:
                vol = lookup_volume(pool, name)
                if vol is None:
                    log.warning("lock %s vanished while held", name)
                    return
                _stamp(conn, vol)
            except Exception as error:  # the fetch itself will meet the same problem
                log.warning("could not renew lock %s: %s", name, error)
                return

    thread = threading.Thread(target=beat, name=f"lock-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=HEARTBEAT + 30)
        with contextlib.suppress(libvirt.libvirtError):
            vol = lookup_volume(pool, name)
            if vol is not None:
                vol.delete(0)


def wait_for_other(
    pool: Any,
    name: str,
    done: Callable[[], bool],
    log: Log,
    *,
    stale: float | None = None,
    poll: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Waits while another writer holds the lock. True: `done()` (its marker
    is there); False: the lock is gone or stale (then removed here), so the
    caller may try to take it."""
    stale = STALE if stale is None else stale
    poll = POLL if poll is None else poll
    last: str | None = None
    since = clock()
    announced = False
    while True:
        if done():
            return True
        vol = lookup_volume(pool, name)
        if vol is None:
            return False
        try:
            seen = fingerprint(vol)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
                return False
            raise
        now = clock()
        if seen != last:
            last, since = seen, now
        elif now - since >= stale:
            log.warning(
                "lock %s unchanged for %.0f s: its writer is gone; taking over", name, now - since
            )
            with contextlib.suppress(libvirt.libvirtError):
                vol.delete(0)
            return False
        if not announced:
            log.info("another writer is fetching this base image; waiting for it (%s)", name)
            announced = True
        sleep(poll)


__all__ = [
    "HEARTBEAT",
    "STALE",
    "LockLost",
    "fingerprint",
    "held",
    "lock_volume",
    "try_lock",
    "wait_for_other",
]
