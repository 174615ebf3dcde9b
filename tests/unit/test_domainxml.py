"""Domain XML builder: golden files, schema validation, validation errors, and the
metadata round trip through libvirt's real in-memory driver (test:///default)."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import libvirt
import pytest

from providers.kvm.domainxml import (
    NS_PREFIX,
    NS_URI,
    DomainSpec,
    ProxyMetadata,
    build_domain_xml,
    parse_domain,
    parse_metadata,
)
from tests.support import GOLDEN_DIR, assert_golden

VIRT_XML_VALIDATE = Path("/usr/bin/virt-xml-validate")

CREATED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
META = ProxyMetadata(project="egress-proxies", stack="dev", name="home-0", created=CREATED)
IMAGES = "/var/lib/libvirt/images"


def spec(name: str = "proxy-3f2a9c1b7d", **overrides: Any) -> DomainSpec:
    fields: dict[str, Any] = {
        "name": name,
        "memory_mib": 1024,
        "vcpus": 1,
        "disk_path": f"{IMAGES}/{name}.qcow2",
        "seed_path": f"{IMAGES}/{name}-seed.iso",
        "metadata": META,
        "bridge": "br0",
    }
    fields.update(overrides)
    return DomainSpec(**fields)


GOLDEN_SPECS: dict[str, DomainSpec] = {
    # The default for a real host.
    "domain_kvm_uefi_bridge.xml": spec(),
    # A TCG host such as the build machine, on an isolated libvirt network.
    "domain_qemu_uefi_network.xml": spec(
        "proxy-0a1b2c3d4e",
        domain_type="qemu",
        cpu_mode="maximum",
        memory_mib=512,
        vcpus=2,
        bridge=None,
        network="egress-test",
        metadata=dataclasses.replace(META, stack="ci", name="tcg-1"),
    ),
    # An image that says firmware "bios"; the MAC is given in upper case on purpose.
    "domain_bios_custom_cpu_mac.xml": spec(
        "proxy-9e8d7c6b5a",
        firmware="bios",
        cpu_mode="Skylake-Client-v4",
        mac="52:54:00:AB:cd:01",
        memory_mib=2048,
        vcpus=4,
    ),
}


# --- golden files -------------------------------------------------------------


@pytest.mark.parametrize("golden", sorted(GOLDEN_SPECS))
def test_golden(golden: str) -> None:
    assert_golden(golden, build_domain_xml(GOLDEN_SPECS[golden]))


def test_output_is_deterministic() -> None:
    a = build_domain_xml(spec())
    b = build_domain_xml(spec())
    assert a == b
    assert a.endswith("</domain>\n")
    assert "\n  <name>proxy-3f2a9c1b7d</name>\n" in a  # 2-space indent


def _golden_files() -> list[Path]:
    files = sorted(GOLDEN_DIR.glob("domain_*.xml"))
    assert files, f"no golden domain files in {GOLDEN_DIR}; run with UPDATE_GOLDEN=1"
    return files


def test_every_golden_file_has_a_spec() -> None:
    assert {f.name for f in _golden_files()} == set(GOLDEN_SPECS)


@pytest.mark.parametrize("golden", sorted(GOLDEN_SPECS))
def test_golden_file_passes_libvirt_schema(golden: str) -> None:
    if not VIRT_XML_VALIDATE.exists():
        pytest.fail(
            f"{VIRT_XML_VALIDATE} is missing: install the test packages "
            "(apt-get install libvirt-clients) to validate domain XML against libvirt's schema"
        )
    path = GOLDEN_DIR / golden
    result = subprocess.run(
        [str(VIRT_XML_VALIDATE), str(path), "domain"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{path} fails libvirt's schema:\n{result.stderr}{result.stdout}"


# --- structure ---------------------------------------------------------------


def test_cpu_rule_modes_and_custom_model() -> None:
    for mode in ("host-passthrough", "host-model", "maximum"):
        assert f'<cpu mode="{mode}" />' in build_domain_xml(spec(cpu_mode=mode))
    custom = build_domain_xml(spec(cpu_mode="qemu64"))
    assert '<cpu mode="custom">\n    <model>qemu64</model>\n  </cpu>' in custom
    assert spec(cpu_mode="qemu64").cpu_model == "qemu64"
    assert spec().cpu_model is None


def test_bios_has_no_firmware_and_boots_from_the_disk() -> None:
    xml = build_domain_xml(spec(firmware="bios"))
    assert "<os>" in xml
    assert "firmware" not in xml
    assert "<smm" not in xml
    # Boot order lives on the disk; libvirt refuses <os><boot dev=...> alongside it.
    assert "<boot dev" not in xml
    assert '<boot order="1" />' in xml


def test_no_graphics() -> None:
    xml = build_domain_xml(spec())
    assert "<graphics" not in xml
    assert '<model type="none" />' in xml


def test_xml_special_characters_are_escaped() -> None:
    path = "/srv/a&b <c>'\"/disk.qcow2"
    meta = dataclasses.replace(META, project="p&<q>")
    xml = build_domain_xml(spec(disk_path=path, metadata=meta))
    info = parse_domain(xml)
    assert info.disk_path == path
    assert info.metadata == meta


# --- parse_domain ---------------------------------------------------------------


@pytest.mark.parametrize("golden", sorted(GOLDEN_SPECS))
def test_parse_domain_reads_back_the_spec(golden: str) -> None:
    s = GOLDEN_SPECS[golden]
    info = parse_domain(build_domain_xml(s))
    assert info.name == s.name
    assert info.domain_type == s.domain_type
    assert info.memory_mib == s.memory_mib
    assert info.vcpus == s.vcpus
    assert info.cpu_mode == s.cpu_mode
    assert info.firmware == s.firmware
    assert info.secure_boot is False  # the builder always turns it off
    assert info.disk_path == s.disk_path
    assert info.seed_path == s.seed_path
    assert info.bridge == s.bridge
    assert info.network == s.network
    assert info.mac == s.mac
    assert info.metadata == s.metadata
    assert [(d.device, d.target, d.bus, d.format) for d in info.disks] == [
        ("disk", "vda", "virtio", "qcow2"),
        ("cdrom", "sda", "sata", "raw"),
    ]


def test_parse_domain_libvirt_expanded_forms() -> None:
    """What a qemu driver may return: KiB, loader/nvram instead of firmware='efi',
    custom CPU with extra attributes, live-only attributes, other prefix."""
    xml = f"""<domain type='kvm' id='7'>
  <name>proxy-3f2a9c1b7d</name>
  <metadata>
    <x:proxy xmlns:x="{NS_URI}">
      <x:managed>false</x:managed><x:project>p</x:project><x:stack>s</x:stack>
      <x:name>n-0</x:name><x:created>2025-01-02T04:04:05+01:00</x:created>
    </x:proxy>
  </metadata>
  <memory unit='KiB'>1572864</memory>
  <currentMemory unit='KiB'>1048576</currentMemory>
  <vcpu placement='static' current='1'>3</vcpu>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <loader readonly='yes' secure='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.ms.fd</loader>
    <nvram>/var/lib/libvirt/qemu/nvram/proxy-3f2a9c1b7d_VARS.fd</nvram>
  </os>
  <cpu mode='custom' match='exact' check='partial'><model fallback='forbid'>EPYC</model></cpu>
  <devices>
    <disk type='file' device='disk'>
      <source file='/pool/o.qcow2' index='2'/><target dev='vda' bus='virtio'/>
    </disk>
    <disk type='volume' device='disk'><source pool='default' volume='v'/></disk>
    <interface type='network'>
      <mac address='52:54:00:AA:BB:CC'/>
      <source network='egress-test' portid='0d7c' bridge='virbr1'/>
      <model type='virtio'/>
    </interface>
  </devices>
</domain>"""
    info = parse_domain(xml)
    assert info.memory_mib == 1536
    assert info.vcpus == 3
    assert (info.firmware, info.secure_boot) == ("uefi", True)
    assert info.cpu_mode == "EPYC"
    assert info.disk_path == "/pool/o.qcow2"
    assert info.disks[1].path is None
    assert info.seed_path is None
    assert (info.network, info.bridge, info.mac) == ("egress-test", None, "52:54:00:aa:bb:cc")
    assert info.metadata == ProxyMetadata(
        project="p", stack="s", name="n-0", created=CREATED, managed=False
    )


@pytest.mark.parametrize(
    ("memory", "mib"),
    [
        ("<memory>262144</memory>", 256),
        ("<memory unit='MiB'>300</memory>", 300),
        ("<memory unit='G'>2</memory>", 2048),
        ("<memory unit='bytes'>1073741824</memory>", 1024),
        ("<memory unit='MB'>1048576</memory>", 1000000),
    ],
)
def test_parse_domain_memory_units(memory: str, mib: int) -> None:
    xml = f"<domain type='qemu'><name>x</name>{memory}<vcpu>1</vcpu></domain>"
    info = parse_domain(xml)
    assert info.memory_mib == mib
    assert info.firmware == "bios"
    assert info.metadata is None
    assert info.cpu_mode is None
    assert info.mac is None


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<domain", "not well-formed"),
        ("<network/>", "root element is <network>"),
        ("<domain><name>x</name><vcpu>1</vcpu></domain>", "<memory> is missing"),
        ("<domain><name>x</name><memory>1</memory><vcpu>two</vcpu></domain>", "'two'"),
        ("<domain><name>x</name><memory unit='Q'>1</memory><vcpu>1</vcpu></domain>", "'Q'"),
    ],
)
def test_parse_domain_errors(xml: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_domain(xml)


# --- validation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "home-0"}, r"DomainSpec\.name: 'home-0' is not a proxy id"),
        ({"name": "proxy-3F2A9C1B7D"}, r"DomainSpec\.name"),
        ({"name": "proxy-3f2a9c1b7d\n"}, r"DomainSpec\.name: .* control character"),
        ({"domain_type": "xen"}, r"DomainSpec\.domain_type: 'xen'"),
        ({"memory_mib": 127}, r"DomainSpec\.memory_mib: 127 is below the minimum of 128"),
        ({"memory_mib": True}, r"DomainSpec\.memory_mib: True is not an integer"),
        ({"memory_mib": "1024"}, r"DomainSpec\.memory_mib: '1024' is not an integer"),
        ({"vcpus": 0}, r"DomainSpec\.vcpus: 0 is below the minimum of 1"),
        ({"cpu_mode": ""}, r"DomainSpec\.cpu_mode: '' is empty"),
        ({"cpu_mode": "custom"}, r"DomainSpec\.cpu_mode: 'custom' is not a CPU model"),
        ({"cpu_mode": "host passthrough"}, r"DomainSpec\.cpu_mode: 'host passthrough'"),
        ({"firmware": "efi"}, r"DomainSpec\.firmware: 'efi' is not 'uefi' or 'bios'"),
        ({"disk_path": "images/p.qcow2"}, r"DomainSpec\.disk_path: .* not an absolute path"),
        ({"disk_path": "/a\nb.qcow2"}, r"DomainSpec\.disk_path: .* control character '\\n'"),
        ({"seed_path": "/var/lib/libvirt/images/"}, r"DomainSpec\.seed_path: .* directory"),
        (
            {"seed_path": f"{IMAGES}/proxy-3f2a9c1b7d.qcow2"},
            r"DomainSpec\.seed_path: .* same file as disk_path",
        ),
        ({"bridge": None}, r"DomainSpec\.network/bridge: exactly one .* network=None bridge=None"),
        ({"network": "default"}, r"DomainSpec\.network/bridge: exactly one"),
        ({"bridge": "a-very-long-bridge0"}, r"DomainSpec\.bridge: 'a-very-long-bridge0'"),
        ({"bridge": "br 0"}, r"DomainSpec\.bridge"),
        ({"bridge": None, "network": "a/b"}, r"DomainSpec\.network: 'a/b' contains '/'"),
        ({"bridge": None, "network": ""}, r"DomainSpec\.network: '' is empty"),
        ({"mac": "52:54:00:00:00"}, r"DomainSpec\.mac: '52:54:00:00:00' is not a MAC"),
        ({"mac": "01:00:5e:00:00:01"}, r"DomainSpec\.mac: .* multicast"),
        ({"mac": "00:00:00:00:00:00"}, r"DomainSpec\.mac: .* all-zero"),
        ({"metadata": {"name": "x"}}, r"DomainSpec\.metadata: .* not a ProxyMetadata"),
    ],
)
def test_validation_errors(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec(**overrides)


def test_mac_is_normalised_to_lower_case() -> None:
    assert spec(mac="52:54:00:AB:CD:EF").mac == "52:54:00:ab:cd:ef"


def test_metadata_validation_and_normalisation() -> None:
    with pytest.raises(ValueError, match=r"ProxyMetadata\.created: .* has no timezone"):
        ProxyMetadata(project="p", stack="s", name="n", created=datetime(2025, 1, 1))
    with pytest.raises(ValueError, match=r"ProxyMetadata\.stack: '' is empty"):
        ProxyMetadata(project="p", stack="", name="n", created=CREATED)
    with pytest.raises(ValueError, match=r"ProxyMetadata\.name: .* control character"):
        ProxyMetadata(project="p", stack="s", name="a\tb", created=CREATED)
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2025, 1, 2, 5, 4, 5, 999_999, tzinfo=plus_two)
    meta = ProxyMetadata(project="p", stack="s", name="n", created=local)
    assert meta.created == CREATED
    assert meta.created.tzinfo is UTC


# --- parse_metadata -------------------------------------------------------------


def test_parse_metadata_forms() -> None:
    xml = build_domain_xml(spec())
    assert parse_metadata(xml) == META
    element = META.to_set_metadata_xml()
    assert element.startswith("<proxy>\n  <managed>true</managed>")
    assert parse_metadata(element) == META
    prefixed = f'<q:proxy xmlns:q="{NS_URI}"><q:managed>true</q:managed><q:project>egress-proxies</q:project><q:stack>dev</q:stack><q:name>home-0</q:name><q:created>2025-01-02T03:04:05Z</q:created></q:proxy>'
    assert parse_metadata(prefixed) == META


@pytest.mark.parametrize(
    "xml",
    [
        "<domain type='kvm'><name>x</name></domain>",
        "<domain><metadata><o:proxy xmlns:o='urn:other'/></metadata></domain>",
        "<other/>",
        "<o:proxy xmlns:o='urn:other'><o:managed>true</o:managed></o:proxy>",
    ],
)
def test_parse_metadata_not_ours(xml: str) -> None:
    assert parse_metadata(xml) is None


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<proxy", "not well-formed"),
        ("<proxy><managed>true</managed></proxy>", "'project' is missing"),
        (
            META.to_set_metadata_xml().replace(">true<", ">yes<"),
            "managed 'yes' is not true or false",
        ),
        (
            META.to_set_metadata_xml().replace("2025-01-02T03:04:05Z", "yesterday"),
            "created 'yesterday' is not an RFC 3339 time",
        ),
        (
            META.to_set_metadata_xml().replace("2025-01-02T03:04:05Z", "2025-01-02T03:04:05"),
            "has no timezone",
        ),
        (
            META.to_set_metadata_xml().replace("<stack>dev</stack>", "<stack/>"),
            r"ProxyMetadata\.stack: '' is empty",
        ),
    ],
)
def test_parse_metadata_malformed(xml: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_metadata(xml)


# --- libvirt's in-memory driver -----------------------------------------------------


@pytest.fixture
def conn() -> Iterator[Any]:
    libvirt.registerErrorHandler(lambda *_: None, None)
    connection = libvirt.open("test:///default")
    try:
        yield connection
    finally:
        connection.close()


@pytest.mark.parametrize("golden", sorted(GOLDEN_SPECS))
def test_round_trip_through_libvirt_test_driver(conn: Any, golden: str) -> None:
    # test:///default state is shared by every connection of the process: use
    # names nobody else defines and always undefine.
    s = dataclasses.replace(GOLDEN_SPECS[golden], name="proxy-7e57d21fe0")
    dom = conn.defineXML(build_domain_xml(s))
    try:
        element = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS_URI)
        # libvirt hands back the element with its namespace stripped.
        assert element.lstrip().startswith("<proxy>")
        assert parse_metadata(element) == s.metadata

        desc = dom.XMLDesc()
        assert parse_metadata(desc) == s.metadata
        info = parse_domain(desc)
        assert info.name == s.name
        assert info.domain_type == s.domain_type
        assert info.memory_mib == s.memory_mib  # libvirt answers in KiB
        assert info.vcpus == s.vcpus
        assert info.cpu_mode == s.cpu_mode
        assert (info.firmware, info.secure_boot) == (s.firmware, False)
        assert (info.disk_path, info.seed_path) == (s.disk_path, s.seed_path)
        assert (info.bridge, info.network) == (s.bridge, s.network)
        if s.mac is not None:
            assert info.mac == s.mac
        else:  # libvirt generated one
            assert info.mac is not None and info.mac.startswith("52:54:00:")
    finally:
        dom.undefine()


def test_metadata_survives_a_prefix_change_by_libvirt(conn: Any) -> None:
    dom = conn.defineXML(build_domain_xml(spec("proxy-7e57d21fe1")))
    try:
        updated = dataclasses.replace(META, name="home-1", managed=False)
        dom.setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT,
            updated.to_set_metadata_xml(),
            "other",
            NS_URI,
            libvirt.VIR_DOMAIN_AFFECT_CONFIG,
        )
        desc = dom.XMLDesc()
        assert "<other:proxy" in desc
        assert f"<{NS_PREFIX}:proxy" not in desc
        assert parse_metadata(desc) == updated
        assert parse_domain(desc).metadata == updated
        assert parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS_URI)) == updated
    finally:
        dom.undefine()


def test_domain_without_our_metadata(conn: Any) -> None:
    # The test driver ships one domain ("test") that is not ours.
    dom = conn.lookupByName("test")
    with pytest.raises(libvirt.libvirtError):
        dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS_URI)
    assert parse_metadata(dom.XMLDesc()) is None
    assert parse_domain(dom.XMLDesc()).metadata is None
