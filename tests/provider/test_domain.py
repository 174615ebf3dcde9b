"""ProxyDomain through the engine's gRPC path, booting a real VM on the testbed."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libvirt
import pytest

from providers.kvm.capacity import MIB, free_memory
from providers.kvm.domain import ProxyDomainProvider, mac_for
from providers.kvm.volumes import lookup_volume, upload, volume_xml
from proxyinfra.names import overlay_volume, proxy_id, seed_volume
from tests.harness.engine import ProviderError, ProviderProcess, make_urn, provider_inputs
from tests.support.images import tiny_image
from tests.support.testbed import Testbed, access_for, refresh_pool

# A create waits up to ipTimeoutSeconds (120, props below) for the guest's
# address: the call's own deadline must be longer, or a guest slow to boot
# on a loaded machine is cut off by the harness, not by the provider.
pytestmark = [pytest.mark.integration, pytest.mark.provider_engine(rpc_timeout=180)]
libvirt.registerErrorHandler(lambda _c, _e: None, None)


@dataclass
class Disks:
    proxy: str
    overlay: str
    seed: str


@pytest.fixture
def disks(local: libvirt.virConnect, pool: Any) -> Iterator[Disks]:
    """A base from the tiny image, an overlay on it and a blank seed, made directly."""
    image = tiny_image()
    tag = uuid.uuid4().hex[:8]
    pid = proxy_id("egress-proxies", "domain-test", tag)
    base = pool.createXML(
        volume_xml(f"domain-test-base-{tag}.qcow2", image.stat().st_size, "qcow2"), 0
    )
    upload(local, base, [image.read_bytes()])
    refresh_pool(pool)
    base = pool.storageVolLookupByName(f"domain-test-base-{tag}.qcow2")
    overlay = pool.createXML(
        volume_xml(overlay_volume(pid), 1024**3, "qcow2", (base.path(), "qcow2")), 0
    )
    seed = pool.createXML(volume_xml(seed_volume(pid), 1024 * 1024, "raw"), 0)
    try:
        yield Disks(pid, overlay.path(), seed.path())
    finally:
        for name in (overlay_volume(pid), seed_volume(pid), base.name()):
            vol = lookup_volume(pool, name)
            if vol is not None:
                vol.delete(0)
        with_domain = [d for d in local.listAllDomains(0) if d.name() == pid]
        for dom in with_domain:
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


def props(testbed: Testbed, disks: Disks, **changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "host": access_for(testbed).to_props(),
        "name": disks.proxy,
        "project": "egress-proxies",
        "stack": "domain-test",
        "logicalName": "home-0",
        "memoryMib": 256,
        "vcpus": 1,
        "domainType": "qemu",
        "cpuMode": "maximum",
        "firmware": "uefi",
        "diskPath": disks.overlay,
        "seedPath": disks.seed,
        "baseVolume": "base",
        "seedSha256": "seed",
        "ipTimeoutSeconds": 120,
        "shutdownTimeoutSeconds": 20,
    }
    values.update(changes)
    return provider_inputs(ProxyDomainProvider(), values)


def domain_names(local: libvirt.virConnect) -> list[str]:
    return [d.name() for d in local.listAllDomains(0)]


def rpc_lines(engine: ProviderProcess, since: int) -> list[str]:
    return [line for line in engine.log_text()[since:].splitlines() if " kvm.libvirt " in line]


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (the testbed's libvirtd runs on this machine)."""
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return fields


def test_a_hosts_free_memory_for_a_guest_counts_its_page_cache(
    local: libvirt.virConnect, tmp_path: Path
) -> None:
    """What a create checks (and the autopilot's room) is what the kernel can
    give a new guest: free memory and the page cache it drops for it. MemFree
    alone refused a 512 MiB domain on this machine with gigabytes in its cache."""
    cached = tmp_path / "cached"
    with cached.open("wb") as out:  # 512 MiB the page cache now holds
        for _ in range(64):
            out.write(b"\0" * (8 * MIB))
    before = meminfo()
    counted = free_memory(local)
    after = meminfo()
    assert counted >= max(before["MemFree"], after["MemFree"]) + 256 * MIB
    assert counted <= max(before["MemTotal"], after["MemTotal"])


def test_boots_gets_its_lease_refreshes_and_deletes(
    engine: ProviderProcess, testbed: Testbed, disks: Disks, local: libvirt.virConnect
) -> None:
    urn = make_urn(disks.proxy)
    inputs = props(testbed, disks)
    assert engine.check(urn, {}, inputs).failures == []
    mark = len(engine.log_text())
    created = engine.create(urn, inputs)
    create_rpcs = rpc_lines(engine, mark)
    out = created.properties
    assert created.id == disks.proxy
    assert out["mac"] == mac_for(disks.proxy)
    assert re.fullmatch(r"10\.251\.77\.\d+", out["ip"])
    net = local.networkLookupByName(testbed.network)
    assert out["ip"] in [lease["ipaddr"] for lease in net.DHCPLeases(out["mac"])]
    dom = local.lookupByName(disks.proxy)
    assert dom.isActive()
    # The metadata element is there, in our namespace, read back by local name.
    from providers.kvm.domainxml import NS_URI, parse_metadata

    meta = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS_URI))
    assert meta is not None and (meta.project, meta.stack, meta.name) == (
        "egress-proxies",
        "domain-test",
        "home-0",
    )
    # RPCs: a fixed handful plus two per poll while the guest boots.
    polls = sum("virDomainInterfaceAddresses" in line for line in create_rpcs)
    fixed = len(create_rpcs) - 2 * polls
    assert fixed <= 10, "\n".join(create_rpcs)

    mark = len(engine.log_text())
    read = engine.read(created.id, urn, out)
    assert read.id == created.id and read.properties["state"] == "running"
    assert read.properties["ip"] == out["ip"]
    assert len(rpc_lines(engine, mark)) <= 5  # lookup, state, network, lease, definition
    # The definition read back from a real libvirtd matches the inputs: no drift.
    assert engine.diff(created.id, urn, read.properties, inputs).action == "same"

    dom.destroy()  # out of band, as `virsh destroy` would
    assert engine.read(created.id, urn, out).properties["state"] == "shutoff"

    engine.delete(created.id, urn, out)
    assert disks.proxy not in domain_names(local)
    engine.delete(created.id, urn, out)  # already gone: fine
    assert engine.read(created.id, urn, out).id == ""


def test_graceful_shutdown_on_delete(
    engine: ProviderProcess, testbed: Testbed, disks: Disks, local: libvirt.virConnect
) -> None:
    urn = make_urn(disks.proxy)
    created = engine.create(urn, props(testbed, disks))
    mark = len(engine.log_text())
    engine.delete(created.id, urn, created.properties)
    lines = rpc_lines(engine, mark)
    assert any("virDomainShutdown" in line for line in lines)
    assert not any("virDomainDestroy" in line for line in lines)  # the guest powered off itself
    assert disks.proxy not in domain_names(local)


def test_failed_creates_leave_nothing(
    engine: ProviderProcess, testbed: Testbed, disks: Disks, local: libvirt.virConnect
) -> None:
    urn = make_urn(disks.proxy)
    with pytest.raises(ProviderError) as no_net:
        moved = access_for(testbed).to_props() | {"network": "no-such-network"}
        engine.create(urn, props(testbed, disks, host=moved))
    assert "no-such-network" in no_net.value.message
    assert disks.proxy not in domain_names(local)

    with pytest.raises(ProviderError) as timeout:
        engine.create(urn, props(testbed, disks, ipTimeoutSeconds=2))
    assert "got no IP address within 2s" in timeout.value.message
    assert f"MAC {mac_for(disks.proxy)}" in timeout.value.message
    assert disks.proxy not in domain_names(local)

    with pytest.raises(ProviderError) as memory:
        engine.create(urn, props(testbed, disks, memoryMib=64 * 1024 * 1024))
    assert (
        "of memory free, domain" in memory.value.message
        and "needs 64.00 GiB" not in memory.value.message
    )
    assert "host 'testbed'" in memory.value.message
    assert disks.proxy not in domain_names(local)


def test_diff_replaces_and_updates(engine: ProviderProcess, testbed: Testbed, disks: Disks) -> None:
    urn = make_urn(disks.proxy)
    olds = props(testbed, disks)
    same = engine.diff(disks.proxy, urn, olds, props(testbed, disks))
    assert same.action == "same"
    for key, value in (
        ("memoryMib", 512),
        ("seedSha256", "other"),
        ("baseVolume", "b2"),
        ("firmware", "bios"),
    ):
        d = engine.diff(disks.proxy, urn, olds, props(testbed, disks, **{key: value}))
        assert d.action == "replace" and d.replaces == [key] and d.delete_before_replace
    d = engine.diff(disks.proxy, urn, olds, props(testbed, disks, ipTimeoutSeconds=30))
    assert d.action == "update"


def test_check_names_the_problem(engine: ProviderProcess, testbed: Testbed, disks: Disks) -> None:
    checked = engine.check(make_urn(disks.proxy), {}, props(testbed, disks, memoryMib=64))
    assert len(checked.failures) == 1
    assert "memory_mib: 64 is below the minimum of 128" in checked.failures[0][1]
