"""Overlay through the engine's gRPC path against the testbed's libvirtd; the
result checked on the host with qemu-img as root."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import libvirt
import pulumi
import pytest

from providers.kvm.overlay import Overlay, OverlayArgs, OverlayProvider
from providers.kvm.volumes import GIB, MIB, VolumeInfo, lookup_volume, volume_xml
from proxyinfra.names import overlay_volume, proxy_id
from tests.harness.engine import (
    DYNAMIC_TYPE,
    UNKNOWN,
    ProviderError,
    ProviderProcess,
    make_urn,
    provider_inputs,
)
from tests.harness.program import run_program
from tests.support.testbed import Testbed, access_for, load_testbed

pytestmark = pytest.mark.integration
libvirt.registerErrorHandler(lambda _c, _e: None, None)


class FailingAfterCreateProvider(OverlayProvider):
    """Fails right after libvirt made the volume (pickled by reference: the
    provider process imports this module from the project root)."""

    @staticmethod
    def _describe(vol: Any) -> VolumeInfo:
        raise RuntimeError("injected failure after the volume was created")


@dataclass
class Case:
    name: str  # the overlay's volume name
    base_path: str
    base_name: str


@pytest.fixture
def case(pool: Any) -> Iterator[Case]:
    """A small qcow2 base (1 GiB virtual) made by libvirt, and an overlay name."""
    tag = uuid.uuid4().hex[:8]
    base_name = f"overlay-test-base-{tag}.qcow2"
    base = pool.createXML(volume_xml(base_name, 1 * GIB, "qcow2"), 0)
    made = Case(
        overlay_volume(proxy_id("egress-proxies", "overlay-test", tag)), base.path(), base_name
    )
    try:
        yield made
    finally:
        for name in (made.name, base_name):
            if (vol := lookup_volume(pool, name)) is not None:
                vol.delete(0)


def props(
    testbed: Testbed, case: Case, provider: OverlayProvider | None = None, **changes: Any
) -> dict[str, Any]:
    values: dict[str, Any] = {
        "host": access_for(testbed).to_props(),
        "name": case.name,
        "basePath": case.base_path,
        "baseFormat": "qcow2",
        "sizeGb": 2,
        "path": None,
        "capacity": None,
    }
    values.update(changes)
    return provider_inputs(provider or OverlayProvider(), values)


def qemu_img_chain(path: str) -> list[dict[str, Any]]:
    """`qemu-img info` as root on the host (-U: do not take the image lock)."""
    out = subprocess.run(
        ["qemu-img", "info", "-U", "--backing-chain", "--output=json", path],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    chain: list[dict[str, Any]] = json.loads(out)
    return chain


def volume_names(pool: Any) -> list[str]:
    return [v.name() for v in pool.listAllVolumes(0)]


def rpc_lines(engine: ProviderProcess, since: int) -> list[str]:
    return [line for line in engine.log_text()[since:].splitlines() if " kvm.libvirt " in line]


def test_create_makes_a_thin_qcow2_on_the_base_and_read_reports_it(
    engine: ProviderProcess, testbed: Testbed, case: Case
) -> None:
    urn = make_urn(case.name)
    checked = engine.check(urn, {}, props(testbed, case))
    assert checked.failures == []
    mark = len(engine.log_text())
    created = engine.create(urn, checked.inputs)
    create_rpcs = rpc_lines(engine, mark)
    out = created.properties
    assert created.id == case.name
    assert out["capacity"] == 2 * GIB
    top, base = qemu_img_chain(out["path"])
    assert top["format"] == "qcow2"
    assert top["virtual-size"] == 2 * GIB
    assert top["backing-filename"] == case.base_path
    assert top["backing-filename-format"] == "qcow2"
    assert top["actual-size"] < 1 * MIB  # thin: only qcow2 metadata
    assert base["filename"] == case.base_path and base["virtual-size"] == 1 * GIB
    assert len(create_rpcs) <= 8, "\n".join(create_rpcs)

    mark = len(engine.log_text())
    read = engine.read(created.id, urn, out)
    assert len(rpc_lines(engine, mark)) <= 4
    assert read.id == case.name
    for key in ("path", "capacity", "basePath", "baseFormat"):
        assert read.properties[key] == out[key], key
    assert engine.diff(created.id, urn, read.properties, checked.inputs).action == "same"


def test_a_raw_base_is_recorded_as_raw(
    engine: ProviderProcess, testbed: Testbed, case: Case, pool: Any
) -> None:
    raw_name = case.base_name.replace(".qcow2", ".raw")
    raw = pool.createXML(volume_xml(raw_name, 512 * MIB, "raw"), 0)
    try:
        out = engine.create(
            make_urn(case.name), props(testbed, case, basePath=raw.path(), baseFormat="raw")
        ).properties
        top, base = qemu_img_chain(out["path"])
        assert (top["backing-filename"], top["backing-filename-format"]) == (raw.path(), "raw")
        assert base["format"] == "raw"
        assert (out["basePath"], out["baseFormat"]) == (raw.path(), "raw")
    finally:
        if (vol := lookup_volume(pool, case.name)) is not None:
            vol.delete(0)
        raw.delete(0)


def test_growing_updates_in_place_and_other_changes_replace_first(
    engine: ProviderProcess, testbed: Testbed, case: Case, pool: Any
) -> None:
    urn = make_urn(case.name)
    out = engine.create(urn, props(testbed, case)).properties
    grow = props(testbed, case, sizeGb=3)
    diff = engine.diff(case.name, urn, out, grow)
    assert diff.action == "update"
    grown = engine.update(case.name, urn, out, grow)
    assert grown["capacity"] == 3 * GIB
    assert qemu_img_chain(grown["path"])[0]["virtual-size"] == 3 * GIB

    # Grown out of band beyond the declared size and refreshed: left alone.
    pool.storageVolLookupByName(case.name).resize(4 * GIB, 0)
    refreshed = engine.read(case.name, urn, grown).properties
    assert refreshed["capacity"] == 4 * GIB
    assert engine.diff(case.name, urn, refreshed, grow).action == "same"

    for key, value in (
        ("sizeGb", 2),  # shrinking: a new, smaller disk
        ("basePath", "/var/lib/libvirt/images/other.qcow2"),
        ("baseFormat", "raw"),
        ("name", "other.qcow2"),
        ("sizeGb", UNKNOWN),  # preview: might shrink
    ):
        change: dict[str, Any] = {"sizeGb": 3, key: value}
        diff = engine.diff(case.name, urn, grown, props(testbed, case, **change))
        assert (diff.action, diff.replaces, diff.delete_before_replace) == (
            "replace",
            [key],
            True,
        ), key


def test_an_overlay_smaller_than_its_base_or_on_a_wrong_format_is_refused_first(
    engine: ProviderProcess, testbed: Testbed, case: Case, pool: Any
) -> None:
    urn = make_urn(case.name)
    big_name = case.base_name.replace(".qcow2", "-big.qcow2")
    big = pool.createXML(volume_xml(big_name, 1 * GIB + 64 * MIB, "qcow2"), 0)
    try:
        with pytest.raises(ProviderError) as small:
            engine.create(urn, props(testbed, case, basePath=big.path(), sizeGb=1))
        assert "would be smaller than its base image" in small.value.message
        assert "set diskSizeGb to at least 2" in small.value.message
        assert "host 'testbed'" in small.value.message
    finally:
        big.delete(0)
    with pytest.raises(ProviderError) as wrong:
        engine.create(urn, props(testbed, case, baseFormat="raw"))
    assert f"{case.base_path} is 'qcow2', not 'raw'" in wrong.value.message
    with pytest.raises(ProviderError) as missing:
        engine.create(urn, props(testbed, case, basePath="/nowhere/base.qcow2"))
    assert "/nowhere/base.qcow2 is not a volume libvirt knows" in missing.value.message
    assert case.name not in volume_names(pool)


def test_a_create_failing_after_the_volume_exists_removes_it(
    engine: ProviderProcess, testbed: Testbed, case: Case, pool: Any
) -> None:
    with pytest.raises(ProviderError) as failed:
        engine.create(make_urn(case.name), props(testbed, case, FailingAfterCreateProvider()))
    assert "injected failure" in failed.value.message
    assert case.name not in volume_names(pool)


def test_an_existing_overlay_is_adopted_only_on_the_same_base(
    engine: ProviderProcess, testbed: Testbed, case: Case, pool: Any
) -> None:
    urn = make_urn(case.name)
    # Left by a create that was killed: same base, smaller.
    pool.createXML(volume_xml(case.name, 1 * GIB, "qcow2", (case.base_path, "qcow2")), 0)
    adopted = engine.create(urn, props(testbed, case)).properties
    assert adopted["capacity"] == 2 * GIB  # grown to what was asked
    assert f"name={case.name} adopted existing overlay" in engine.log_text()
    assert qemu_img_chain(adopted["path"])[0]["backing-filename"] == case.base_path
    pool.storageVolLookupByName(case.name).delete(0)

    # Something else under that name: never taken over, never deleted.
    pool.createXML(volume_xml(case.name, 2 * GIB, "qcow2"), 0)
    with pytest.raises(ProviderError) as foreign:
        engine.create(urn, props(testbed, case))
    message = foreign.value.message
    assert f"volume {case.name!r} already exists in pool {testbed.pool!r}" in message
    assert "backed by nothing" in message and f"virsh vol-delete --pool {testbed.pool}" in message
    assert case.name in volume_names(pool)


def test_refresh_after_out_of_band_delete_and_tolerant_delete(
    engine: ProviderProcess, testbed: Testbed, case: Case, pool: Any
) -> None:
    urn = make_urn(case.name)
    out = engine.create(urn, props(testbed, case)).properties
    engine.delete(case.name, urn, out)
    assert case.name not in volume_names(pool)
    engine.delete(case.name, urn, out)  # already gone: fine
    assert engine.read(case.name, urn, out).id == ""

    out = engine.create(urn, props(testbed, case)).properties
    pool.storageVolLookupByName(case.name).delete(0)  # out of band, as virsh vol-delete
    assert engine.read(case.name, urn, out).id == ""


def test_check_reports_bad_inputs_and_lets_unknowns_through(
    engine: ProviderProcess, testbed: Testbed, case: Case
) -> None:
    urn = make_urn(case.name)
    bad = props(testbed, case, basePath="relative.qcow2", baseFormat="vmdk", sizeGb=1.5)
    failures = dict(engine.check(urn, {}, bad).failures)
    assert set(failures) == {"basePath", "baseFormat", "sizeGb"}
    preview = props(testbed, case, basePath=UNKNOWN)
    assert engine.check(urn, {}, preview).failures == []


def overlay_program() -> dict[str, Any]:
    """A stack with one Overlay (run by test_the_resource_class_in_a_program)."""
    config = pulumi.Config()
    disk = Overlay(
        "disk",
        OverlayArgs(
            host=access_for(load_testbed()),
            name=config.require("name"),
            base_path=config.require("basePath"),
            base_format="qcow2",
            size_gb=3,
        ),
    )
    return {"path": disk.path, "capacity": disk.capacity}


def test_the_resource_class_in_a_program(testbed: Testbed, case: Case, pool: Any) -> None:
    result = run_program(
        "tests.provider.test_overlay:overlay_program",
        {"name": case.name, "basePath": case.base_path},
        hybrid=True,
        mode="up",
    ).raise_for_error()
    disk = result.resource("disk", DYNAMIC_TYPE)
    assert disk.inputs["sizeGb"] == 3 and disk.inputs["host"]["pool"] == testbed.pool
    assert result.output("capacity") == 3 * GIB
    assert qemu_img_chain(result.output("path"))[0]["backing-filename"] == case.base_path
    assert disk.secret_outputs == []
