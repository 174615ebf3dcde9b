"""ProxyDomain's create, read, update, delete and failed-create cleanup,
in-process against libvirt's test driver (tests/support/testdriver.py).
The same paths on a real libvirtd with a booting guest: tests/provider/test_domain.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import libvirt
import pytest

from providers.kvm.capacity import GIB, MIB, free_memory
from providers.kvm.domain import DomainArgs, ProxyDomainProvider, mac_for
from providers.kvm.domainxml import NS_URI
from providers.kvm.errors import CapacityError, KvmError
from tests.support.domain_props import NAME, domain_inputs
from tests.support.testdriver import NETWORK, TestHost


def inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    return domain_inputs(host, **changes)


def create(host: TestHost, **changes: Any) -> dict[str, Any]:
    props = inputs(host, **changes)
    result = ProxyDomainProvider().create(props)
    assert result.outs is not None
    return dict(result.outs)


def test_create_defines_starts_and_reports_the_address(test_host: TestHost) -> None:
    outs = create(test_host)
    dom = test_host.raw.lookupByName(NAME)
    assert dom.isActive()
    assert outs["state"] == "running"
    assert outs["mac"] == mac_for(NAME)
    assert outs["ip"].startswith("192.168.150.")
    xml = dom.XMLDesc(0)
    assert f"<source network='{NETWORK}'/>" in xml
    assert NS_URI in xml and "<ep:name>home-0</ep:name>" in xml


def test_read_of_an_untouched_domain_changes_nothing(test_host: TestHost) -> None:
    outs = create(test_host)
    read = ProxyDomainProvider().read(NAME, outs)
    assert read.id == NAME
    assert read.outs == outs
    diff = ProxyDomainProvider().diff(NAME, dict(read.outs or {}), inputs(test_host))
    assert diff.changes is False


def _set_memory(root: ET.Element) -> None:
    for tag in ("memory", "currentMemory"):
        node = root.find(tag)
        assert node is not None
        node.text, node.attrib["unit"] = "512", "MiB"


def _set_vcpus(root: ET.Element) -> None:
    node = root.find("vcpu")
    assert node is not None
    node.text = "3"


def _swap_disk(root: ET.Element) -> None:
    source = root.find("devices/disk[@device='disk']/source")
    assert source is not None
    source.set("file", "/elsewhere/other.qcow2")


def _other_mac(root: ET.Element) -> None:
    mac = root.find("devices/interface/mac")
    assert mac is not None
    mac.set("address", "52:54:00:00:00:01")


def _drop_metadata(root: ET.Element) -> None:
    meta = root.find("metadata")
    assert meta is not None
    root.remove(meta)


@pytest.mark.parametrize(
    ("edit", "key", "found"),
    [
        (_set_memory, "memoryMib", 512),
        (_set_vcpus, "vcpus", 3),
        (_swap_disk, "diskPath", "/elsewhere/other.qcow2"),
        (_other_mac, "mac", "52:54:00:00:00:01"),
        (_drop_metadata, "logicalName", None),
    ],
)
def test_read_reports_a_definition_changed_out_of_band(
    test_host: TestHost, edit: Any, key: str, found: Any
) -> None:
    outs = create(test_host)
    test_host.redefine(NAME, edit)
    read = ProxyDomainProvider().read(NAME, outs)
    assert read.outs is not None and read.outs[key] == found
    # ... so the next up repairs it: the declared inputs differ from what was read.
    diff = ProxyDomainProvider().diff(NAME, dict(read.outs), inputs(test_host))
    assert diff.changes is True
    assert key in (diff.replaces or []) or key == "logicalName"


def test_read_reports_a_nic_moved_to_another_network(test_host: TestHost) -> None:
    outs = create(test_host)

    def move(root: ET.Element) -> None:
        source = root.find("devices/interface/source")
        assert source is not None
        source.set("network", "elsewhere")

    test_host.redefine(NAME, move)
    read = ProxyDomainProvider().read(NAME, outs)
    assert read.outs is not None and read.outs["host"]["network"] == "elsewhere"
    diff = ProxyDomainProvider().diff(NAME, dict(read.outs), inputs(test_host))
    assert diff.replaces == ["host"]


def test_removed_metadata_is_written_again_in_place(test_host: TestHost) -> None:
    outs = create(test_host)
    test_host.redefine(NAME, _drop_metadata)
    read = ProxyDomainProvider().read(NAME, outs)
    assert read.outs is not None
    diff = ProxyDomainProvider().diff(NAME, dict(read.outs), inputs(test_host))
    assert diff.replaces == [] and diff.changes is True
    ProxyDomainProvider().update(NAME, dict(read.outs), inputs(test_host))
    again = ProxyDomainProvider().read(NAME, outs)
    assert again.outs is not None and again.outs["logicalName"] == "home-0"


def test_read_of_a_vanished_domain_is_empty(test_host: TestHost) -> None:
    outs = create(test_host)
    dom = test_host.raw.lookupByName(NAME)
    dom.destroy()
    dom.undefine()
    assert ProxyDomainProvider().read(NAME, outs).id == ""


def test_read_shows_a_stopped_domain_and_update_starts_it(test_host: TestHost) -> None:
    outs = create(test_host)
    test_host.raw.lookupByName(NAME).destroy()
    read = ProxyDomainProvider().read(NAME, outs)
    assert read.outs is not None and read.outs["state"] == "shutoff"
    diff = ProxyDomainProvider().diff(NAME, dict(read.outs), inputs(test_host))
    assert diff.changes is True and diff.replaces == []
    updated = ProxyDomainProvider().update(NAME, dict(read.outs), inputs(test_host))
    assert updated.outs is not None and updated.outs["state"] == "running"
    assert test_host.raw.lookupByName(NAME).isActive()


def test_delete_removes_the_domain(test_host: TestHost) -> None:
    outs = create(test_host)
    ProxyDomainProvider().delete(NAME, outs)
    assert NAME not in test_host.domains()
    ProxyDomainProvider().delete(NAME, outs)  # already gone: nothing to do


def test_a_create_without_an_address_leaves_no_domain(test_host: TestHost) -> None:
    test_host.answer_from = set()
    with pytest.raises(KvmError, match=r"got no IP address within 1s on network 'proxies'"):
        create(test_host, ipTimeoutSeconds=1)
    assert NAME not in test_host.domains()


def test_a_host_without_the_memory_refuses_before_defining(test_host: TestHost) -> None:
    test_host.free_memory = 128 * 1024 * 1024
    with pytest.raises(
        CapacityError, match=r"128\.0 MiB of memory free, domain .* needs 256\.0 MiB"
    ):
        create(test_host)
    assert test_host.domains() == set()


class NodeStats:
    """A connection's node memory: stats (KiB) as virNodeGetMemoryStats gives
    them, or the error it raises."""

    def __init__(self, stats: dict[str, int] | None, error: int = 0) -> None:
        self.stats, self.error = stats, error

    def getMemoryStats(self, cell: int) -> dict[str, int]:
        assert cell == libvirt.VIR_NODE_MEMORY_STATS_ALL_CELLS
        if self.stats is None:
            error = libvirt.libvirtError("virNodeGetMemoryStats failed")
            error.err = (self.error, 0, "", 0, "", None, None, 0, 0)
            raise error
        return self.stats

    def getFreeMemory(self) -> int:
        return 100 * MIB


def test_a_guest_may_have_the_hosts_free_memory_and_its_page_cache() -> None:
    # What a host that ran a while looks like: little free, much cached.
    host = NodeStats(
        {
            "total": 8 * GIB // 1024,
            "free": 300 * 1024,
            "buffers": 20 * 1024,
            "cached": 3 * GIB // 1024,
        }
    )
    assert free_memory(host) == 300 * MIB + 20 * MIB + 3 * GIB
    # libvirt's test driver has no node stats: its free memory.
    assert free_memory(NodeStats(None, libvirt.VIR_ERR_NO_SUPPORT)) == 100 * MIB
    # Any other failure is no answer: raised, not guessed.
    with pytest.raises(libvirt.libvirtError):
        free_memory(NodeStats(None, libvirt.VIR_ERR_INTERNAL_ERROR))


def test_inputs_round_trip_through_the_engine_as_floats(test_host: TestHost) -> None:
    props = inputs(test_host)
    floats = props | {"memoryMib": 256.0, "vcpus": 1.0, "ipTimeoutSeconds": 5.0}
    floats["host"] = props["host"] | {"port": 22.0}
    assert DomainArgs.from_props(floats) == DomainArgs.from_props(props)
    assert ProxyDomainProvider().diff(NAME, floats, props).changes is False


def test_a_missing_or_mistyped_input_names_its_key(test_host: TestHost) -> None:
    props = inputs(test_host)
    del props["cpuMode"]
    with pytest.raises(ValueError, match="input 'cpuMode' is missing"):
        DomainArgs.from_props(props)
    with pytest.raises(ValueError, match=r"input 'memoryMib': expected a whole number, got 2\.5"):
        DomainArgs.from_props(inputs(test_host, memoryMib=2.5))


def test_a_domain_left_by_a_killed_run_is_replaced(test_host: TestHost) -> None:
    first = create(test_host)
    # The run that made it was killed: the state never learned of it.
    again = create(test_host)
    assert again["created"] >= first["created"]
    assert test_host.domains() == {NAME}
    assert test_host.raw.lookupByName(NAME).isActive()


def test_a_domain_of_another_stack_under_the_name_is_left_alone(test_host: TestHost) -> None:
    create(test_host, stack="other")
    uuid = test_host.raw.lookupByName(NAME).UUIDString()
    with pytest.raises(
        KvmError,
        match=r"exists and is not this stack's \(project 'egress-proxies', stack 'other'\)",
    ):
        create(test_host)
    assert test_host.raw.lookupByName(NAME).UUIDString() == uuid


def test_a_libvirt_failure_during_create_names_the_host(test_host: TestHost) -> None:
    test_host.answer_from = set()

    class Broken(ProxyDomainProvider):
        @staticmethod
        def _remove(dom: Any, shutdown_timeout: float) -> None:
            raise libvirt.libvirtError("internal error: client socket is closed")

        def _wait_for_ip(self, conn: Any, dom: Any, args: DomainArgs[str]) -> tuple[str, str]:
            raise libvirt.libvirtError("End of file while reading data: Input/output error")

    with pytest.raises(libvirt.libvirtError) as caught:
        Broken().create(inputs(test_host))
    notes = "\n".join(caught.value.__notes__)
    assert "End of file while reading data" in str(caught.value)  # the first error, kept
    assert "host 'testhost'" in notes and f"domain {NAME}" in notes
    assert "may remain: internal error: client socket is closed" in notes


@pytest.mark.parametrize(
    ("source", "access", "logged"),
    [
        (libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, {}, "the guest agent"),
        (
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
            {"network": None, "bridge": "br0"},
            "the guest agent",
        ),
        (
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            {"network": None, "bridge": "br0"},
            "the host's ARP table",
        ),
    ],
    ids=["agent-on-network", "agent-on-bridge", "arp-on-bridge"],
)
def test_the_create_logs_where_the_address_came_from(
    test_host: TestHost,
    caplog: pytest.LogCaptureFixture,
    source: int,
    access: dict[str, Any],
    logged: str,
) -> None:
    test_host.answer_from = {source}  # the driver knows them all
    props = inputs(test_host) | {"host": test_host.access(**access).to_props()}
    caplog.set_level("INFO", logger="kvm")
    result = ProxyDomainProvider().create(props)
    assert result.outs is not None
    ip = result.outs["ip"]
    lines = [r.getMessage() for r in caplog.records if "domain has address" in r.getMessage()]
    assert len(lines) == 1 and f"domain has address {ip} from {logged} after" in lines[0], lines
