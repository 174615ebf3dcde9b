"""A libvirt host inside the test process, for fast tests of the kvm resources.

The host itself is the product's simulated host (providers.kvm.simulated:
libvirt's test driver, with upload, download, resize, free memory and DHCP
filled in, each change written under the test's directory), put behind the
kvm connector seam (``providers.kvm.connection.use_connector``), so a
provider's create, read, update and delete run in-process exactly as on a
real host, minus SSH.

What only tests need is added here: the faults of tests/support/host_faults.py
(a broken upload, a pre-written qcow2 file, a guest without an address), the
order of finished uploads, a host of 4 GiB free memory, and helpers to look
at or change the host out of band.
"""

from __future__ import annotations

import contextlib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.connection import use_connector
from providers.kvm.simulated import GIB, POOL_ROOT
from tests.support.host_faults import FaultyHost

POOL = "proxies"
POOL_PATH = f"{POOL_ROOT}/{POOL}"
NETWORK = "proxies"


class TestHost(FaultyHost):
    """One in-memory libvirt host; ``with host.serving():`` routes every kvm
    resource of this process to it."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, *, free_memory: int = 4 * GIB) -> None:
        super().__init__(directory, pool=POOL, network=NETWORK)
        self.free_memory = free_memory

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
