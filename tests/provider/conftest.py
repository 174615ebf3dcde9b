"""Fixtures of the provider tests, each defined once: the provider process a
module drives over gRPC, the testbed's libvirtd and pool as root, the image
server, and what a BaseImage test works with (`lab`).

A module sets its provider process's options with its mark
``pytest.mark.provider_engine(log=..., rpc_timeout=...)``; without it, the
debug log and a 60 s RPC timeout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from providers.kvm.access import HostAccess
from providers.kvm.volumes import lookup_volume
from tests.harness.engine import ProviderProcess
from tests.support.baseimages import BaseImageLab
from tests.support.http import FileServer
from tests.support.testbed import URI, Testbed, access_for

ENGINE_MARK = "provider_engine"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{ENGINE_MARK}(log='debug', rpc_timeout=60.0): the options of the module's "
        "provider process (tests/provider/conftest.py)",
    )


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Iterator[ProviderProcess]:
    """One provider process per module (`python -m pulumi.dynamic` over gRPC),
    with the options of the module's `provider_engine` mark."""
    mark = request.node.get_closest_marker(ENGINE_MARK)
    options: dict[str, Any] = {"log": "debug", "rpc_timeout": 60.0, **(mark.kwargs if mark else {})}
    env = {"EGRESS_PROXIES_LOG": str(options["log"])}
    with ProviderProcess(env=env, rpc_timeout=float(options["rpc_timeout"])) as process:
        yield process


@pytest.fixture(scope="module")
def server() -> Iterator[FileServer]:
    with FileServer() as files:
        yield files


@pytest.fixture(scope="module")
def local(testbed: Testbed) -> Iterator[libvirt.virConnect]:
    """The testbed's libvirtd through the local socket, as root: set-up and checks
    behind the provider's back."""
    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    conn = libvirt.open(URI)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def pool(testbed: Testbed, local: libvirt.virConnect) -> Any:
    """The testbed's storage pool, as root."""
    return local.storagePoolLookupByName(testbed.pool)


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


@pytest.fixture
def lab(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    pool: Any,
    made: list[str],
    tmp_path: Path,
) -> BaseImageLab:
    return BaseImageLab(engine, server, testbed, access, pool, made, tmp_path)
