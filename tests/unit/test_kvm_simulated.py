"""Simulated hosts (providers.kvm.simulated): what one provider process leaves
on a host, the next finds, as the CLI runs one process per command; and the
environment variable, read once when the provider process starts, nothing
else, puts them in place through the connection seam."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import libvirt
import pytest

from providers.kvm import connection, resource, simulated
from providers.kvm.connection import source, use_connector
from providers.kvm.simulated import SIMULATED_HOSTS_ENV, SimulatedHost, simulated_host
from providers.kvm.volumes import upload
from tests.support.testdriver import TestHost

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>256</memory>
  <metadata><p:proxy xmlns:p="urn:egress-proxies:test">owner {name}</p:proxy></metadata>
  <os><type arch='x86_64'>hvm</type></os>
  <devices><disk type='file' device='disk'><source file='{disk}'/><target dev='vda' bus='virtio'/>
  </disk></devices></domain>"""


def _volume(name: str, capacity: int, backing: str | None = None) -> str:
    store = (
        f"<backingStore><path>{backing}</path><format type='qcow2'/></backingStore>"
        if backing
        else ""
    )
    return (
        f"<volume><name>{name}</name><capacity unit='bytes'>{capacity}</capacity>"
        f"<target><format type='qcow2'/></target>{store}</volume>"
    )


def _host(directory: Path) -> SimulatedHost:
    return SimulatedHost(directory, pool="vms", network="proxies")


def test_a_second_process_finds_what_the_first_left(tmp_path: Path) -> None:
    first = _host(tmp_path)
    conn = first.libvirt()
    pool = conn.storagePoolLookupByName("vms")
    base = pool.createXML(_volume("base.qcow2", 1 << 30), 0)
    upload(conn, base, [b"QFI\xfb image bytes"], 17)
    overlay = pool.createXML(_volume("p1.qcow2", 2 << 30, backing=base.path()), 0)
    pool.createXML(_volume("gone.qcow2", 1 << 20), 0).delete(0)
    running = conn.defineXML(DOMAIN.format(name="p1", disk=overlay.path()))
    running.create()
    conn.defineXML(DOMAIN.format(name="p2", disk=overlay.path()))  # defined, never started
    stopped = conn.defineXML(DOMAIN.format(name="p3", disk=overlay.path()))
    stopped.create()
    stopped.destroy()
    conn.defineXML(DOMAIN.format(name="p4", disk=overlay.path())).undefineFlags(
        libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
    )
    before = base.XMLDesc(0)
    first.close()

    second = _host(tmp_path)
    conn = second.libvirt()
    pool = conn.storagePoolLookupByName("vms")
    assert sorted(v.name() for v in pool.listAllVolumes(0)) == ["base.qcow2", "p1.qcow2"]
    again = pool.storageVolLookupByName("base.qcow2")
    assert again.XMLDesc(0) == before  # contents, their size and mtime
    assert second.contents[again.path()] == b"QFI\xfb image bytes"
    layered = pool.storageVolLookupByName("p1.qcow2").XMLDesc(0)
    assert f"<path>{again.path()}</path>" in layered and "2147483648" in layered
    states = {d.name(): d.state()[0] for d in conn.listAllDomains(0)}
    assert states == {
        "p1": libvirt.VIR_DOMAIN_RUNNING,
        "p2": libvirt.VIR_DOMAIN_SHUTOFF,
        "p3": libvirt.VIR_DOMAIN_SHUTOFF,
    }
    meta = conn.lookupByName("p1").metadata(
        libvirt.VIR_DOMAIN_METADATA_ELEMENT, "urn:egress-proxies:test"
    )
    assert "owner p1" in meta

    # Everything removed in the second is gone for a third.
    for name in ("p1", "p2", "p3"):
        dom = conn.lookupByName(name)
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(0)
    for vol in pool.listAllVolumes(0):
        vol.delete(0)
    second.close()
    third = _host(tmp_path)
    assert third.raw.listAllDomains(0) == []
    assert third.raw.storagePoolLookupByName("vms").listAllVolumes(0) == []
    assert not any((tmp_path / "contents").iterdir())
    third.close()


def test_a_resized_volume_keeps_its_new_capacity_for_the_next_process(tmp_path: Path) -> None:
    first = _host(tmp_path)
    conn = first.libvirt()
    pool = conn.storagePoolLookupByName("vms")
    base = pool.createXML(_volume("base.qcow2", 1 << 30), 0)
    overlay = pool.createXML(_volume("p1.qcow2", 2 << 30, backing=base.path()), 0)
    upload(conn, overlay, [b"QFI\xfb overlay"], 12)
    overlay.resize(5 << 30, 0)
    # The handle still finds it by name, in this process.
    assert overlay.info()[1] == 5 << 30
    first.close()

    second = _host(tmp_path)
    pool = second.libvirt().storagePoolLookupByName("vms")
    again = pool.storageVolLookupByName("p1.qcow2")
    assert again.info()[1] == 5 << 30
    assert f"<path>{base.path()}</path>" in again.XMLDesc(0)  # the same backing file
    assert second.contents[again.path()] == b"QFI\xfb overlay"
    second.close()


@pytest.fixture
def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a provider process not started yet (the CLI starts one
    per command); the seam and the simulated hosts are put back afterwards."""
    monkeypatch.setattr(resource, "_started", False)
    monkeypatch.setattr(resource, "_process", contextlib.ExitStack())
    monkeypatch.setattr(connection, "_connector", connection._connector)
    monkeypatch.setattr(simulated, "_hosts", {})


@pytest.mark.usefixtures("new_process")
def test_without_the_environment_hosts_are_reached_over_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    access = TestHost(tmp_path / "t").access(provider="home", host="nas/1")
    monkeypatch.delenv(SIMULATED_HOSTS_ENV, raising=False)
    resource.start()
    assert isinstance(source(access), connection.HostConnection)

    # Read once, at start: set later, the variable changes nothing.
    monkeypatch.setenv(SIMULATED_HOSTS_ENV, str(tmp_path / "sim"))
    resource.start()
    assert isinstance(source(access), connection.HostConnection)


@pytest.mark.usefixtures("new_process")
def test_the_environment_puts_simulated_hosts_in_place_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    access = TestHost(tmp_path / "t").access(provider="home", host="nas/1")
    monkeypatch.setenv(SIMULATED_HOSTS_ENV, str(tmp_path / "sim"))
    with caplog.at_level(logging.WARNING, logger="kvm"):
        resource.start()
        resource.start()  # once per process
        host = source(access)
        assert source(access) is host  # one per host per process
    assert isinstance(host, SimulatedHost)
    assert host.directory == tmp_path / "sim" / "home--nas_2f1"
    warned = [r.getMessage() for r in caplog.records if SIMULATED_HOSTS_ENV in r.getMessage()]
    assert len(warned) == 1 and "simulated" in warned[0], warned
    assert host is simulated_host(tmp_path / "sim", access)

    # Through the one seam: a connector put in place later comes first, and
    # the simulated hosts come back after it.
    other = TestHost(tmp_path / "other")
    with use_connector(lambda _access: other):
        assert source(access) is other
    assert source(access) is host
