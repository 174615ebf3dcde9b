"""RPC tracing over libvirt's own in-memory test driver."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import libvirt
import pytest

from providers.kvm.trace import Traced, api_name, error_label, wrap
from proxyinfra.logs import TRACE

libvirt.registerErrorHandler(lambda _c, _e: None, None)


@pytest.fixture
def conn() -> Iterator[Traced]:
    raw = libvirt.open("test:///default")
    yield wrap(raw, "provider=p host=h")
    raw.close()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kvm.libvirt"]


def test_each_rpc_is_one_line_with_api_identifiers_result_and_duration(
    conn: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kvm.libvirt")
    dom = conn.lookupByName("test")
    dom.state()
    pool = conn.storagePoolLookupByName("default-pool")
    pool.listAllVolumes()
    got = lines(caplog)
    assert len(got) == 4
    assert re.fullmatch(
        r"virDomainLookupByName provider=p host=h name=test \(\d+\.\d\d ms\)", got[0]
    )
    assert re.fullmatch(
        r"virDomainGetState provider=p host=h domain=test state=running \(\d+\.\d\d ms\)", got[1]
    )
    assert got[2].startswith("virStoragePoolLookupByName provider=p host=h name=default-pool")
    assert re.match(
        r"virStoragePoolListAllVolumes provider=p host=h pool=default-pool count=\d+ \(", got[3]
    )
    assert isinstance(dom, Traced) and isinstance(pool, Traced)


def test_failures_carry_the_libvirt_error_code_name_and_number(
    conn: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kvm.libvirt")
    with pytest.raises(libvirt.libvirtError) as info:
        conn.lookupByName("nope")
    assert error_label(info.value) == "VIR_ERR_NO_DOMAIN(42)"
    (line,) = lines(caplog)
    assert line.startswith(
        "virDomainLookupByName provider=p host=h name=nope failed VIR_ERR_NO_DOMAIN(42): "
    )


def test_xml_and_listing_names_only_at_trace(
    conn: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kvm.libvirt")
    conn.lookupByName("test").XMLDesc(0)
    conn.listAllDomains(0)
    debug = "\n".join(lines(caplog))
    assert "<domain" not in debug and "names=" not in debug
    caplog.clear()
    caplog.set_level(TRACE, logger="kvm.libvirt")
    conn.lookupByName("test").XMLDesc(0)
    conn.listAllDomains(0)
    trace = "\n".join(lines(caplog))
    assert "<domain type='test' id='1'>" in trace and "names=test" in trace


def test_local_calls_are_not_traced(conn: Traced, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kvm.libvirt")
    dom = conn.lookupByName("test")
    caplog.clear()
    assert dom.name() == "test"
    dom.UUIDString()
    assert lines(caplog) == []


def test_api_names() -> None:
    assert api_name("Connect", "lookupByName") == "virDomainLookupByName"
    assert api_name("StoragePool", "createXML") == "virStorageVolCreateXML"
    assert api_name("Domain", "destroy") == "virDomainDestroy"
    assert api_name("StorageVol", "delete") == "virStorageVolDelete"
