"""Fixtures the BaseImage provider tests share (test_baseimage*.py); other
modules here define their own of the same names, which take precedence."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import libvirt
import pytest

from providers.kvm.access import HostAccess
from providers.kvm.volumes import lookup_volume
from tests.support.http import FileServer
from tests.support.testbed import Testbed, access_for


@pytest.fixture(scope="module")
def server() -> Iterator[FileServer]:
    with FileServer() as files:
        yield files


@pytest.fixture(scope="module")
def pool(testbed: Testbed) -> Iterator[Any]:
    """The testbed pool through the local socket, as root: set-up and clean-up."""
    conn = libvirt.open("qemu:///system")
    yield conn.storagePoolLookupByName(testbed.pool)
    conn.close()


@pytest.fixture(scope="module")
def access(testbed: Testbed) -> HostAccess:
    return access_for(testbed)


@pytest.fixture
def made(pool: Any) -> Iterator[list[str]]:
    """Volume names a test may leave behind when it fails half way."""
    names: list[str] = []
    yield names
    for name in names:
        if (vol := lookup_volume(pool, name)) is not None:
            vol.delete(0)
