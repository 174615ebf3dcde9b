"""Libvirt hosts simulated inside the provider process: libvirt's own test
driver (``test:///<node.xml>``, a real libvirt kept in memory) standing in for
a host reached over SSH, so that ``pulumi up``, ``refresh`` and ``destroy`` of
hundreds of proxies run through the real CLI on one machine (bench/stack_scale)
and the fast tests run the providers without SSH.

Selected only by the environment variable :data:`SIMULATED_HOSTS_ENV` naming a
directory, read once when the provider process starts
(providers.kvm.resource.start; the process inherits the CLI's environment),
which then puts :func:`connector` in place through the connection seam
(providers.kvm.connection.use_connector) and logs a warning: no config key
and no program code selects it, so a stack's settings cannot turn it on by
mistake. Each host (provider, host name) keeps its pool's volumes, their
contents and its domains under ``DIR/<provider>--<host>/`` as one file per
object, written through on every change, so the next CLI command (another
process) finds the host as the last one left it. One directory per stack: two
CLI commands at once on one directory would overwrite each other.

The test driver lacks what a real host has in five places, filled in here:
volume upload and download (contents per volume path; ``<physical>`` and
``<timestamps><mtime>`` follow them as libvirt re-reads the file), volume
resize (the volume is made again at the new capacity), free memory (the driver
reports 0), undefine with the NVRAM flag (refused by the driver: dropped),
and DHCP leases (none: addresses come from the driver's interfaceAddresses).
The fast tests use the same host behind the same seam, with their faults
layered on its connection outside the product (tests/support/host_faults.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.connection import Connector

SIMULATED_HOSTS_ENV = "EGRESS_PROXIES_SIMULATED_HOSTS"
GIB = 1024**3
POOL_ROOT = "/var/lib/egress-proxies/simulated"
SIMULATED_FREE_MEMORY = 1024 * GIB  # hundreds of proxies per simulated host fit
TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"

log = logging.getLogger("kvm")


def _node_xml(pool: str, pool_path: str, network: str | None, volumes: str, domains: str) -> str:
    net = (
        f"<network><name>{network}</name><bridge name='virbr-sim'/>"
        "<ip address='192.168.150.1' netmask='255.255.255.0'><dhcp>"
        "<range start='192.168.150.2' end='192.168.150.254'/></dhcp></ip></network>"
        if network
        else ""
    )
    return (
        f"<node xmlns:test='{TEST_NS}'>"
        "<cpu><mhz>2000</mhz><model>x86_64</model><active>2</active><nodes>1</nodes>"
        "<sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>"
        f"<memory>8388608</memory>{net}"
        f"<pool type='dir'><name>{pool}</name><target><path>{pool_path}</path></target>"
        f"{volumes}</pool>{domains}</node>"
    )


def _files(directory: Path) -> list[Path]:
    """The objects saved in ``directory`` (not a write's temporary file)."""
    return sorted(f for f in directory.glob("*") if not f.name.startswith("."))


class SimulatedHost:
    """One libvirt host in memory, made from what ``directory`` holds and
    writing every change back to it; its pool ``pool`` lies at
    ``POOL_ROOT/<pool>``."""

    def __init__(self, directory: Path, *, pool: str, network: str | None) -> None:
        self.directory = directory
        self.free_memory = SIMULATED_FREE_MEMORY
        self.contents: dict[str, bytes] = {}
        self.mtimes: dict[str, float] = {}  # volume path -> when its last upload finished
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        volumes, domains = self._load()
        node = directory / "node.xml"
        node.write_text(_node_xml(pool, f"{POOL_ROOT}/{pool}", network, volumes, domains))
        self.raw = libvirt.open(f"test://{node}")

    # ---- the connector seam -------------------------------------------------

    def libvirt(self) -> Any:
        return _Conn(self.raw, self)

    def bulk(self) -> contextlib.AbstractContextManager[Any]:
        """The same connection: the test driver has no second transport."""
        return contextlib.nullcontext(self.libvirt())

    def close(self) -> None:
        self.raw.close()

    # ---- persistence ----------------------------------------------------------

    def _file(self, kind: str, name: str) -> Path:
        return self.directory / kind / urllib.parse.quote(name, safe="")

    def _load(self) -> tuple[str, str]:
        volumes, domains = [], []
        for file in _files(self.directory / "volumes"):
            volumes.append(file.read_text())
            path = ET.fromstring(volumes[-1]).findtext("target/path") or ""
            data = self.directory / "contents" / file.name
            if data.exists():
                self.contents[path] = data.read_bytes()
                self.mtimes[path] = data.stat().st_mtime
        domains = [file.read_text() for file in _files(self.directory / "domains")]
        return "".join(volumes), "".join(domains)

    def _write(self, kind: str, name: str, data: bytes, mtime: float | None = None) -> None:
        target = self._file(kind, name)
        target.parent.mkdir(exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        tmp.replace(target)

    def save_domain(self, name: str) -> None:
        with self._lock:
            try:
                dom = self.raw.lookupByName(name)
                xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                state = dom.state()[0]
            except libvirt.libvirtError:
                self._file("domains", name).unlink(missing_ok=True)
                return
            # The driver reads a domain's run state back from this element.
            runstate = f"<test:runstate xmlns:test='{TEST_NS}'>{state}</test:runstate>"
            xml = re.sub(r"</domain>\s*$", runstate + "</domain>", xml)
            self._write("domains", name, xml.encode())

    def save_volume(self, vol: Any) -> None:
        with self._lock:
            self._write("volumes", vol.name(), vol.XMLDesc(0).encode())

    def save_contents(self, name: str, path: str) -> None:
        with self._lock:
            self._write("contents", name, self.contents[path], self.mtimes[path])

    def forget_volume(self, name: str) -> None:
        with self._lock:
            self._file("volumes", name).unlink(missing_ok=True)
            self._file("contents", name).unlink(missing_ok=True)


# ---- the libvirt objects, wrapped ------------------------------------------------


class _Wrapper:
    """Delegates to the libvirt object, wrapping what it returns; calls in
    ``CHANGES`` are followed by :meth:`changed` (what persists them)."""

    CHANGES: frozenset[str] = frozenset()

    def __init__(self, raw: Any, host: SimulatedHost) -> None:
        self.raw = raw
        self.host = host

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = _wrap(attr(*args, **kwargs), self.host)
            if name in self.CHANGES:
                self.changed(result)
            return result

        return call

    def changed(self, result: Any) -> None:
        """Persist what a call in CHANGES changed."""


def _wrap(value: Any, host: SimulatedHost) -> Any:
    if isinstance(value, libvirt.virNetwork):
        return _Network(value, host)
    if isinstance(value, libvirt.virStoragePool):
        return _Pool(value, host)
    if isinstance(value, libvirt.virStorageVol):
        return _Vol(value, host)
    if isinstance(value, libvirt.virDomain):
        return _Domain(value, host)
    if isinstance(value, list):
        return [_wrap(v, host) for v in value]
    return value


class _Conn(_Wrapper):
    CHANGES = frozenset({"defineXML", "defineXMLFlags"})

    def changed(self, result: Any) -> None:
        if isinstance(result, _Domain):
            self.host.save_domain(result.raw.name())

    def newStream(self, _flags: int = 0) -> _Stream:
        return _Stream(self.host)

    def getFreeMemory(self) -> int:
        return self.host.free_memory


class _Pool(_Wrapper):
    CHANGES = frozenset({"createXML"})

    def changed(self, result: Any) -> None:
        self.host.save_volume(result.raw)


class _Vol(_Wrapper):
    def upload(self, stream: _Stream, _offset: int, _length: int, _flags: int) -> int:
        stream.target = self
        return 0

    def download(self, stream: _Stream, offset: int, length: int, _flags: int) -> int:
        data = self.host.contents.get(self.raw.path(), b"")
        stream.pending = data[offset : offset + length] if length else data[offset:]
        return 0

    def XMLDesc(self, flags: int = 0) -> str:
        xml: str = self.raw.XMLDesc(flags)
        path = self.raw.path()
        data = self.host.contents.get(path)
        if data is None:
            return xml
        root = ET.fromstring(xml)
        target = root.find("target")
        if target is not None and path in self.host.mtimes:
            stamps = ET.SubElement(target, "timestamps")
            ET.SubElement(stamps, "mtime").text = f"{self.host.mtimes[path]:.9f}"
        for old in root.findall("physical"):
            root.remove(old)
        physical = ET.Element("physical", unit="bytes")
        physical.text = str(len(data))
        root.insert(3, physical)
        return ET.tostring(root, encoding="unicode")

    def resize(self, capacity: int, _flags: int = 0) -> int:
        """The driver cannot resize: the volume is made again, same name and
        backing file, at the new capacity (handles find it by name)."""
        root = ET.fromstring(self.raw.XMLDesc(0))
        node = root.find("capacity")
        assert node is not None
        node.text, node.attrib["unit"] = str(capacity), "bytes"
        pool = self.raw.storagePoolLookupByVolume()
        self.raw.delete(0)
        self.host.save_volume(pool.createXML(ET.tostring(root, encoding="unicode"), 0))
        return 0

    def delete(self, flags: int = 0) -> int:
        path, name = self.raw.path(), self.raw.name()
        result: int = self.raw.delete(flags)
        self.host.contents.pop(path, None)
        self.host.mtimes.pop(path, None)
        self.host.forget_volume(name)
        return result


class _Domain(_Wrapper):
    CHANGES = frozenset(
        {
            "create",
            "createWithFlags",
            "destroy",
            "destroyFlags",
            "shutdown",
            "shutdownFlags",
            "reboot",
            "reset",
            "setMetadata",
            "setAutostart",
            "undefine",
        }
    )

    def changed(self, result: Any) -> None:
        self.host.save_domain(self.raw.name())

    def undefineFlags(self, flags: int = 0) -> int:
        name = self.raw.name()
        result: int = self.raw.undefineFlags(flags & ~libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        self.host.save_domain(name)
        return result

    def qemuAgentCommand(self, _command: str, _timeout: int, _flags: int) -> str:
        """No guest runs here, so no agent answers (libvirt_qemu's call, as a
        method: providers.kvm.squidpush asks a domain for it first)."""
        raise libvirt.libvirtError("Guest agent is not responding: a simulated domain has no guest")


class _Network(_Wrapper):
    def DHCPLeases(self, mac: str | None = None, flags: int = 0) -> list[dict[str, Any]]:
        return []  # the driver keeps none; addresses come from interfaceAddresses


class _Stream:
    """A libvirt stream into or out of a volume's in-memory content."""

    def __init__(self, host: SimulatedHost) -> None:
        self.host = host
        self.target: _Vol | None = None
        self.received = bytearray()
        self.pending = b""

    def send(self, data: bytes) -> int:
        self.received += data
        return len(data)

    def recv(self, size: int) -> bytes:
        chunk, self.pending = self.pending[:size], self.pending[size:]
        return chunk

    def finish(self) -> None:
        if self.target is not None:
            path = self.target.raw.path()
            self.host.contents[path] = bytes(self.received)
            self.host.mtimes[path] = time.time()
            self.host.save_contents(self.target.raw.name(), path)

    def abort(self) -> None:
        self.received.clear()


# ---- hosts selected by the environment ------------------------------------------

_hosts: dict[tuple[str, str], SimulatedHost] = {}
_hosts_lock = threading.Lock()


def _dir_name(text: str) -> str:
    """A directory name for any host name, without ``%`` or ``/`` (it ends up
    in a ``test://`` URI, where those are decoded)."""
    return "".join(c if c.isalnum() or c in "-." else f"_{ord(c):02x}" for c in text)


def simulated_root() -> Path | None:
    """The directory of simulated hosts, when the environment asks for them."""
    value = os.environ.get(SIMULATED_HOSTS_ENV, "")
    return Path(value) if value else None


def connector(root: Path) -> Connector:
    """The seam's connector for hosts simulated under ``root``; logs that
    nothing will reach a real host (once: the provider puts it in place once)."""
    log.warning(
        "%s=%s: every kvm host is simulated by libvirt's test driver; nothing reaches a real host",
        SIMULATED_HOSTS_ENV,
        root,
    )
    return lambda access: simulated_host(root, access)


def simulated_host(root: Path, access: HostAccess) -> SimulatedHost:
    """The simulated host of ``access`` (one per provider and host name per
    process), made from what ``root`` holds for it."""
    key = (access.provider, access.host)
    with _hosts_lock:
        host = _hosts.get(key)
        if host is None:
            host = _hosts[key] = SimulatedHost(
                root / _dir_name(f"{access.provider}--{access.host}"),
                pool=access.pool,
                network=access.network,
            )
        return host
