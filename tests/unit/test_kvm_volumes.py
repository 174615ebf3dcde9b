"""Overlay and SeedIso: create, read, update, delete and failed-create cleanup,
in-process against libvirt's test driver (tests/support/testdriver.py). The
same paths on a real libvirtd over SSH: tests/provider/test_overlay.py and
tests/provider/test_seediso.py."""

from __future__ import annotations

import hashlib
from typing import Any

import libvirt
import pytest

from providers.kvm.errors import CapacityError, HostError, HostResourceMissing
from providers.kvm.iso import build_nocloud_iso
from providers.kvm.overlay import OverlayArgs, OverlayProvider
from providers.kvm.seeddocs import packed
from providers.kvm.seediso import SeedIsoProvider
from providers.kvm.volumes import GIB, VolumeInfo
from tests.support.seeds import SEED, seed_props
from tests.support.testdriver import POOL_PATH, TestHost

OVERLAY = "proxy-0123456789.qcow2"
USER_DATA = "#cloud-config\npassword: hunter2-never-logged\n"


def overlay_inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    args: OverlayArgs[str] = OverlayArgs(
        host=host.access(),
        name=OVERLAY,
        base_path=f"{POOL_PATH}/base.qcow2",
        base_format="qcow2",
        size_gb=4,
    )
    return args.to_props() | changes


def seed_inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    return seed_props(host, USER_DATA, **changes)


@pytest.fixture
def base(test_host: TestHost) -> str:
    return test_host.add_volume("base.qcow2", b"QFI\xfb", fmt="qcow2", capacity=2 * GIB)


def test_overlay_create_read_grow_delete(test_host: TestHost, base: str) -> None:
    provider = OverlayProvider()
    created = provider.create(overlay_inputs(test_host))
    outs = dict(created.outs or {})
    assert created.id == OVERLAY and OVERLAY in test_host.volumes()
    assert outs["path"] == f"{POOL_PATH}/{OVERLAY}"
    assert outs["capacity"] == 4 * GIB
    assert (outs["basePath"], outs["baseFormat"]) == (base, "qcow2")
    assert dict(provider.read(OVERLAY, outs).outs or {}) == outs
    grow = overlay_inputs(test_host, sizeGb=6)
    diff = provider.diff(OVERLAY, outs, grow)
    assert diff.changes is True and not diff.replaces
    grown = provider.update(OVERLAY, outs, grow)
    assert (grown.outs or {})["capacity"] == 6 * GIB
    assert provider.diff(OVERLAY, outs, overlay_inputs(test_host, sizeGb=2)).replaces == ["sizeGb"]
    provider.delete(OVERLAY, outs)
    assert OVERLAY not in test_host.volumes()
    assert provider.read(OVERLAY, outs).id == ""


def test_overlay_on_a_missing_base_makes_nothing(test_host: TestHost) -> None:
    with pytest.raises(HostResourceMissing, match=r"base image .*base\.qcow2 is not a volume"):
        OverlayProvider().create(overlay_inputs(test_host))
    assert test_host.volumes() == set()


def test_overlay_smaller_than_its_base_makes_nothing(test_host: TestHost, base: str) -> None:
    with pytest.raises(HostError, match="would be smaller than its base"):
        OverlayProvider().create(overlay_inputs(test_host, sizeGb=1))
    assert test_host.volumes() == {"base.qcow2"}


def test_overlay_failed_after_create_is_removed(test_host: TestHost, base: str) -> None:
    class Failing(OverlayProvider):
        @staticmethod
        def _describe(vol: Any) -> VolumeInfo:
            raise libvirt.libvirtError("lost the connection after createXML")

    with pytest.raises(libvirt.libvirtError, match="lost the connection"):
        Failing().create(overlay_inputs(test_host))
    assert test_host.volumes() == {"base.qcow2"}


def test_overlay_left_by_a_killed_run_is_adopted(test_host: TestHost, base: str) -> None:
    first = dict(OverlayProvider().create(overlay_inputs(test_host)).outs or {})
    again = dict(OverlayProvider().create(overlay_inputs(test_host)).outs or {})
    assert again["path"] == first["path"] and test_host.volumes() == {"base.qcow2", OVERLAY}


def test_seed_create_uploads_the_built_iso_read_and_delete(test_host: TestHost) -> None:
    provider = SeedIsoProvider()
    props = seed_inputs(test_host)
    created = provider.create(packed(props))
    outs = dict(created.outs or {})
    expected = build_nocloud_iso(USER_DATA, props["metaData"], props["vendorData"], None)
    assert test_host.contents[outs["path"]] == expected
    assert outs["sha256"] == hashlib.sha256(expected).hexdigest()
    assert outs["size"] == len(expected)
    assert dict(provider.read(SEED, outs).outs or {}) == outs
    changed = packed(seed_inputs(test_host, userData="#cloud-config\n{}\n"))
    diff = provider.diff(SEED, outs, changed)
    assert (diff.changes, diff.replaces) == (True, [])  # new documents: in place
    assert provider.diff(SEED, outs, packed(props)).changes is False
    updated = dict(provider.update(SEED, outs, changed).outs or {})
    rewritten = build_nocloud_iso(
        "#cloud-config\n{}\n", props["metaData"], props["vendorData"], None
    )
    assert updated["path"] == outs["path"]
    assert test_host.contents[outs["path"]] == rewritten
    assert updated["sha256"] == hashlib.sha256(rewritten).hexdigest() != outs["sha256"]
    assert provider.diff(SEED, updated, changed).changes is False
    outs = updated
    provider.delete(SEED, outs)
    assert test_host.volumes() == set() and test_host.contents == {}


def test_seed_upload_that_breaks_leaves_no_volume(test_host: TestHost) -> None:
    test_host.fail_upload_after = 100
    with pytest.raises(libvirt.libvirtError, match="broke off"):
        SeedIsoProvider().create(seed_inputs(test_host))
    assert test_host.volumes() == set()


def test_seed_left_by_a_killed_run_is_replaced(test_host: TestHost) -> None:
    test_host.add_volume(SEED, b"half an iso")
    outs = dict(SeedIsoProvider().create(seed_inputs(test_host)).outs or {})
    assert test_host.contents[outs["path"]] != b"half an iso"
    assert test_host.volumes() == {SEED}


def test_an_overlay_larger_than_the_pool_is_refused_before_anything_is_made(
    test_host: TestHost, base: str
) -> None:
    # The test pool holds 100 GiB; the 2 GiB base takes its share.
    with pytest.raises(
        CapacityError,
        match=r"host 'testhost' .*pool 'proxies' has 98\.00 GiB available, "
        r"overlay 'proxy-0123456789\.qcow2' \(200\.00 GiB virtual\) needs 200\.00 GiB",
    ):
        OverlayProvider().create(overlay_inputs(test_host, sizeGb=200))
    assert test_host.volumes() == {"base.qcow2"}
