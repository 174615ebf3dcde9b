"""gc beside other stacks' runs (providers/kvm/gc.py): a domain or volume
removed between gc's listing and its read is nobody's orphan, not an error
(seen when the suite's workers ran two stacks on one testbed)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.gc import find_orphans


def vanished(code: int) -> Exception:
    """libvirt's error for an object gone since it was listed."""
    error = libvirt.libvirtError("gone")
    error.get_error_code = lambda: code
    return error  # type: ignore[no-any-return]


class Dom:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    def metadata(self, *_: Any) -> str:
        raise vanished(libvirt.VIR_ERR_NO_DOMAIN)


class Vol:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    def XMLDesc(self, _flags: int) -> str:
        raise vanished(libvirt.VIR_ERR_NO_STORAGE_VOL)


class Pool:
    def listAllVolumes(self, _flags: int) -> list[Vol]:
        return [Vol("proxy-0123456789.qcow2"), Vol("proxy-0123456789-seed.iso")]


class Conn:
    def listAllDomains(self, _flags: int) -> list[Dom]:
        return [Dom("proxy-0123456789")]

    def storagePoolLookupByName(self, _name: str) -> Pool:
        return Pool()


def test_what_vanishes_during_the_scan_is_skipped() -> None:
    access = HostAccess.__new__(HostAccess)
    object.__setattr__(access, "host", "nas1")
    object.__setattr__(access, "pool", "vms")
    found = find_orphans(
        Conn(), access, "egress-proxies", "dev", set(), {"proxy-0123456789"}, 0, datetime.now(UTC)
    )
    assert found == []
