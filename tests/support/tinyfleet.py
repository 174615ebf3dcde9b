"""A fleet of the tiny test image on the testbed, for the tests and
benchmarks that run `pulumi up` through the real CLI, and what they look
at on the host."""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import libvirt

from tests.support.stack_config import (
    ALL_AT_ONCE,
    image,
    machine_type,
    placement,
    proxy,
    squid,
    stack_config,
    the_testbed_provider,
)
from tests.support.testbed import URI, Testbed, refresh_pool


def tiny_fleet(
    testbed: Testbed, url: str, *, name: str = "solo", replicas: int = 1, ip_timeout: int = 300
) -> dict[str, Any]:
    """Stack config: `replicas` VMs of the image at `url` (its own base) on the
    testbed. The suite boots other TCG guests beside them (a whole Debian
    one among them), and a tiny guest got no address within 180 s in 2 of 5
    CI runs with no cause found: 300 s, and the recovery test of
    tests/engine/test_cli_interrupted.py keeps the guests' consoles."""
    provider = the_testbed_provider(
        testbed,
        images={"tiny": image(url)},
        machine_types={"small": machine_type(1, 256)},
        ip_timeout=ip_timeout,
    )
    where = placement("small", "tiny")
    return stack_config(
        [provider],
        [
            proxy(
                name,
                provider["name"],
                replicas=replicas,
                where=where,
                max_unavailable=ALL_AT_ONCE if replicas > 1 else None,
            )
        ],
        squid(str(testbed.subnet)),
    )


def pool_volumes(testbed: Testbed) -> set[str]:
    """The names of the volumes in the testbed's pool right now."""
    conn = libvirt.open(URI)
    try:
        pool = conn.storagePoolLookupByName(testbed.pool)
        refresh_pool(pool)
        return {v.name() for v in pool.listAllVolumes(0)}
    finally:
        conn.close()


class ConsoleWatch:
    """While a `pulumi up` boots the guests IDS, keeps what each one's serial
    console prints and the DHCP leases of its MAC, for a failure's message
    (a failed create removes its domain: nothing is left to look at after).
    The tiny image prints `TINY-IMAGE: ...` lines as it boots and asks for a
    lease; a guest alive but unanswered says `dhcp ... retrying`."""

    def __init__(self, testbed: Testbed, ids: Sequence[str]) -> None:
        self._network = testbed.network
        self._ids = list(ids)
        self._seen: dict[str, list[str]] = {pid: [] for pid in ids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConsoleWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def report(self) -> str:
        return "\n".join(
            f"{pid}:\n" + "\n".join(f"  {line}" for line in lines[-40:])
            for pid, lines in self._seen.items()
        )

    def _run(self) -> None:
        conn = libvirt.open(URI)
        consoles: dict[str, tuple[str, int]] = {}  # pid -> (pty path, fd)
        leases_said: dict[str, str] = {}
        try:
            while not self._stop.wait(0.5):
                leases = conn.networkLookupByName(self._network).DHCPLeases()
                for pid in self._ids:
                    self._look(conn, pid, leases, consoles, leases_said)
        finally:
            for _, fd in consoles.values():
                os.close(fd)
            conn.close()

    def _look(
        self,
        conn: libvirt.virConnect,
        pid: str,
        leases: list[dict[str, Any]],
        consoles: dict[str, tuple[str, int]],
        leases_said: dict[str, str],
    ) -> None:
        stamp = time.strftime("%H:%M:%S")
        try:
            root = ET.fromstring(conn.lookupByName(pid).XMLDesc(0))
        except libvirt.libvirtError:
            return
        macs = {m.get("address", "") for m in root.iterfind("devices/interface/mac")}
        held = ", ".join(sorted(str(x["ipaddr"]) for x in leases if x.get("mac") in macs))
        if leases_said.get(pid) != held:
            leases_said[pid] = held
            self._seen[pid].append(f"{stamp} leases of {sorted(macs)}: {held or 'none'}")
        source = root.find("devices/serial/source")
        path = source.get("path", "") if source is not None else ""
        if path and consoles.get(pid, ("", 0))[0] != path:
            with contextlib.suppress(OSError):
                consoles[pid] = (path, os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
                self._seen[pid].append(f"{stamp} console {path}")
        if pid in consoles:
            with contextlib.suppress(OSError):
                while select.select([consoles[pid][1]], [], [], 0)[0]:
                    chunk = os.read(consoles[pid][1], 65536)
                    if not chunk:
                        break
                    text = chunk.decode(errors="replace").splitlines()
                    self._seen[pid] += [f"{stamp} {line}" for line in text if line.strip()]
