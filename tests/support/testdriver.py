"""A libvirt host inside the test process, for fast tests of the kvm resources.

libvirt's test driver (``test:///<node.xml>``) is a real libvirt kept in
memory: pools, volumes with backing stores, networks, domains with metadata,
define/start/destroy. Each :class:`TestHost` opens its own (a node file gives
a fresh driver state per connection) and is put behind the kvm connector seam
(``providers.kvm.connection.use_connector``), so a provider's create, read,
update and delete run in-process exactly as on a real host, minus SSH.

The test driver lacks five things a real host has; they are filled in here,
and only here:
- volume upload and download: contents kept in memory per volume path, and
  the volume XML's ``<physical>`` and ``<timestamps><mtime>`` follow them (as
  libvirt re-reads the file);
- volume resize: the volume is made again at the new capacity;
- free memory (the driver reports 0 for a node file): settable per host;
- undefine with the NVRAM flag (refused by the driver): the flag is dropped;
- faults: ``fail_upload_after`` breaks an upload after that many bytes;
  ``prewrite_qcow2`` gives a new qcow2 volume a file of that many bytes (what
  qemu-img create writes), which an upload overwrites but, as libvirt's,
  never truncates.
"""

from __future__ import annotations

import contextlib
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.connection import use_connector

GIB = 1024**3
POOL = "proxies"
POOL_PATH = "/var/lib/egress-proxies/pool"
NETWORK = "proxies"

NODE_XML = f"""<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>2</active><nodes>1</nodes>
    <sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>
  <memory>8388608</memory>
  <network>
    <name>{NETWORK}</name>
    <bridge name='virbr9'/>
    <ip address='192.168.150.1' netmask='255.255.255.0'>
      <dhcp><range start='192.168.150.2' end='192.168.150.254'/></dhcp>
    </ip>
  </network>
  <pool type='dir'>
    <name>{POOL}</name>
    <target><path>{POOL_PATH}</path></target>
  </pool>
</node>
"""

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


class TestHost:
    """One in-memory libvirt host; ``with host.serving():`` routes every kvm
    resource of this process to it."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, *, free_memory: int = 4 * GIB) -> None:
        node = directory / "node.xml"
        node.write_text(NODE_XML)
        self.raw = libvirt.open(f"test://{node}")
        self.free_memory = free_memory
        self.contents: dict[str, bytes] = {}
        self.fail_upload_after: int | None = None
        self.prewrite_qcow2 = 0
        self.prewritten: set[str] = set()  # volume paths given a pre-written file
        self.answer_addresses = True  # False: the guest never reports an address
        self.uploads: list[str] = []  # volume names, in the order their uploads finished
        self.mtimes: dict[str, float] = {}  # volume path -> when its last upload finished

    def libvirt(self) -> Any:
        """The connector seam's answer: this host's connection."""
        return _Conn(self.raw, self)

    def bulk(self) -> contextlib.AbstractContextManager[Any]:
        """The same connection: the test driver has no second transport."""
        return contextlib.nullcontext(self.libvirt())

    @contextlib.contextmanager
    def serving(self) -> Iterator[TestHost]:
        with use_connector(lambda _access: self):
            yield self

    def access(self, **changes: Any) -> HostAccess:
        """Access settings naming this host's pool and network (SSH fields are
        never used: the seam bypasses SSH)."""
        values: dict[str, Any] = {
            "provider": "kvm-test",
            "host": "testhost",
            "address": "127.0.0.1",
            "port": 22,
            "user": "egress",
            "key_file": "/nonexistent/key",
            "known_hosts_file": None,
            "insecure_ignore_host_key": False,
            "socket": "/run/libvirt/libvirt-sock",
            "pool": POOL,
            "bridge": None,
            "network": NETWORK,
        }
        return HostAccess(**(values | changes))

    def volumes(self) -> set[str]:
        pool = self.raw.storagePoolLookupByName(POOL)
        return {vol.name() for vol in pool.listAllVolumes(0)}

    def domains(self) -> set[str]:
        return {dom.name() for dom in self.raw.listAllDomains(0)}

    def add_volume(self, name: str, data: bytes, fmt: str = "raw", capacity: int = 0) -> str:
        """A volume with content, as something else put it there; its path."""
        pool = self.raw.storagePoolLookupByName(POOL)
        xml = (
            f"<volume><name>{name}</name><capacity unit='bytes'>{capacity or len(data)}"
            f"</capacity><target><format type='{fmt}'/></target></volume>"
        )
        vol = pool.createXML(xml, 0)
        path: str = vol.path()
        self.contents[path] = data
        return path

    def redefine(self, name: str, edit: Any) -> None:
        """Change a domain's persistent definition out of band: ``edit`` gets
        the parsed XML root and changes it in place."""
        dom = self.raw.lookupByName(name)
        root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        edit(root)
        self.raw.defineXML(ET.tostring(root, encoding="unicode"))

    def close(self) -> None:
        self.raw.close()


class _Wrapper:
    """Delegates to the libvirt object, wrapping what it returns."""

    def __init__(self, raw: Any, host: TestHost) -> None:
        self.raw = raw
        self.host = host

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return _wrap(attr(*args, **kwargs), self.host)

        return call


def _wrap(value: Any, host: TestHost) -> Any:
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
    def newStream(self, _flags: int = 0) -> _Stream:
        return _Stream(self.host)

    def getFreeMemory(self) -> int:
        return self.host.free_memory


class _Pool(_Wrapper):
    def createXML(self, xml: str, flags: int = 0) -> Any:
        vol = _wrap(self.raw.createXML(xml, flags), self.host)
        fmt = ET.fromstring(xml).find("target/format")
        if self.host.prewrite_qcow2 and fmt is not None and fmt.get("type") == "qcow2":
            path = vol.raw.path()
            self.host.contents[path] = bytes(self.host.prewrite_qcow2)
            self.host.prewritten.add(path)
        return vol


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
        data = self.host.contents.get(self.raw.path())
        if data is None:
            return xml
        root = ET.fromstring(xml)
        target = root.find("target")
        if target is not None and self.raw.path() in self.host.mtimes:
            stamps = ET.SubElement(target, "timestamps")
            ET.SubElement(stamps, "mtime").text = f"{self.host.mtimes[self.raw.path()]:.9f}"
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
        pool.createXML(ET.tostring(root, encoding="unicode"), 0)
        return 0

    def delete(self, flags: int = 0) -> int:
        path = self.raw.path()
        result: int = self.raw.delete(flags)
        self.host.contents.pop(path, None)
        self.host.mtimes.pop(path, None)
        return result


class _Domain(_Wrapper):
    def undefineFlags(self, flags: int = 0) -> int:
        result: int = self.raw.undefineFlags(flags & ~libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        return result

    def interfaceAddresses(self, source: int, flags: int = 0) -> Any:
        if not self.host.answer_addresses:
            return {}
        return self.raw.interfaceAddresses(source, flags)


class _Network(_Wrapper):
    def DHCPLeases(self, mac: str | None = None, flags: int = 0) -> list[dict[str, Any]]:
        return []  # the driver keeps none; addresses come from interfaceAddresses


class _Stream:
    """A libvirt stream into or out of a volume's in-memory content."""

    def __init__(self, host: TestHost) -> None:
        self.host = host
        self.target: _Vol | None = None
        self.received = bytearray()
        self.pending = b""

    def send(self, data: bytes) -> int:
        limit = self.host.fail_upload_after
        if limit is not None and len(self.received) + len(data) > limit:
            raise libvirt.libvirtError("test host: the upload broke off")
        self.received += data
        return len(data)

    def recv(self, size: int) -> bytes:
        chunk, self.pending = self.pending[:size], self.pending[size:]
        return chunk

    def finish(self) -> None:
        if self.target is not None:
            path = self.target.raw.path()
            # Overwritten, not truncated: a pre-written file keeps its tail.
            tail = self.host.contents.get(path, b"")[len(self.received) :]
            kept = tail if path in self.host.prewritten else b""
            self.host.contents[path] = bytes(self.received) + kept
            self.host.mtimes[path] = time.time()
            self.host.uploads.append(self.target.raw.name())

    def abort(self) -> None:
        self.received.clear()
