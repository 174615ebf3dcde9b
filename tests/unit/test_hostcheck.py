"""Host checks over libvirt's in-memory test driver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import libvirt
import pytest

from providers.kvm.access import HostAccess
from providers.kvm.hostcheck import _domain_type, _nic, _pool
from providers.kvm.trace import wrap

libvirt.registerErrorHandler(lambda _c, _e: None, None)


@pytest.fixture
def conn() -> Iterator[Any]:
    raw = libvirt.open("test:///default")
    yield wrap(raw, "provider=p host=h")
    raw.close()


def access(**changes: Any) -> HostAccess:
    values: dict[str, Any] = {
        "provider": "p",
        "host": "h",
        "address": "192.0.2.1",
        "port": 22,
        "user": "virt",
        "key_file": "/k",
        "known_hosts_file": "/kh",
        "insecure_ignore_host_key": False,
        "socket": "/var/run/libvirt/libvirt-sock",
        "pool": "default-pool",
        "bridge": None,
        "network": "default",
    }
    values.update(changes)
    return HostAccess(**values)


def test_pool_present_reports_free_space(conn: Any) -> None:
    row = _pool("h", access(), conn)
    assert row.ok and row.detail.startswith("default-pool: ") and "GiB free of" in row.detail


def test_missing_pool_names_it_and_the_fix(conn: Any) -> None:
    row = _pool("h", access(pool="nope"), conn)
    assert not row.ok
    assert "pool 'nope' not found" in row.detail and "hosts[].pool" in row.detail


def test_network_present_and_missing(conn: Any) -> None:
    assert _nic("h", access(), conn, None).ok  # type: ignore[arg-type]
    row = _nic("h", access(network="gone"), conn, None)  # type: ignore[arg-type]
    assert not row.ok and "libvirt network 'gone' not found" in row.detail


class Caps:
    """A host whose libvirt offers only TCG for x86_64 (and kvm for another arch)."""

    def getCapabilities(self) -> str:
        return """<capabilities><guest><os_type>hvm</os_type>
          <arch name='x86_64'><domain type='qemu'/></arch></guest>
          <guest><os_type>hvm</os_type><arch name='aarch64'><domain type='kvm'/></arch></guest>
        </capabilities>"""


def test_domain_type_offered_or_not() -> None:
    assert _domain_type("h", "qemu", Caps()).ok
    row = _domain_type("h", "kvm", Caps())
    assert not row.ok
    assert (
        row.detail
        == "'kvm' not offered for x86_64 (offered: qemu); set hosts[].domainType: qemu (software emulation)"
    )
