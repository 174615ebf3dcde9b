"""BaseImage's create, cache, read, delete and failed-create cleanup,
in-process against libvirt's test driver (tests/support/testdriver.py) and a
real HTTP server on loopback. The same paths on a real libvirtd over SSH,
with real volume uploads: tests/provider/test_baseimage.py."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

import libvirt
import pytest

from providers.kvm.baseimage import BaseImageArgs, BaseImageProvider
from providers.kvm.errors import ImageError, InUseError
from providers.kvm.volumes import volume_xml
from tests.support.http import FileServer
from tests.support.testdriver import POOL, POOL_PATH, TestHost

# A qcow2 header (magic, version 3, virtual size 1 GiB) and some body.
IMAGE = b"QFI\xfb" + struct.pack(">I", 3) + bytes(16) + struct.pack(">Q", 1 << 30) + bytes(4096)
DIGEST = hashlib.sha256(IMAGE).hexdigest()


@pytest.fixture
def server() -> Iterator[FileServer]:
    with FileServer() as running:
        yield running


def inputs(
    host: TestHost, url: str, *, sha256: str | None = DIGEST, keep: bool = False
) -> dict[str, Any]:
    return BaseImageArgs.of(host.access(), url, sha256, "qcow2", keep).to_props()


def create(host: TestHost, props: dict[str, Any]) -> dict[str, Any]:
    return dict(BaseImageProvider().create(props).outs or {})


def test_create_uploads_the_image_then_writes_the_marker_last(
    test_host: TestHost, server: FileServer
) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    outs = create(test_host, props)
    assert outs["cached"] is False and outs["digest"] == DIGEST and outs["size"] == len(IMAGE)
    assert test_host.contents[outs["path"]] == IMAGE
    assert test_host.contents[f"{POOL_PATH}/{props['marker']}"] == DIGEST.encode()
    # The marker is the last thing written, after the whole image arrived.
    assert test_host.uploads == [props["volume"], props["marker"]]


def test_a_second_create_uses_the_cache_without_downloading(
    test_host: TestHost, server: FileServer
) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    first = create(test_host, props)
    again = create(test_host, props)
    assert server.count("/disk.qcow2") == 1
    assert again["cached"] is True and again["path"] == first["path"]


@pytest.mark.parametrize(
    ("route", "sha256", "error"),
    [
        ({"cut_after": 1000}, None, r"gave 1000 bytes, Content-Length said|broke off after"),
        ({}, "0" * 64, "sha256 mismatch"),
    ],
)
def test_a_short_or_wrong_download_leaves_no_marker_and_no_volume(
    test_host: TestHost, server: FileServer, route: dict[str, Any], sha256: str | None, error: str
) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE, **route), sha256=sha256)
    with pytest.raises(ImageError, match=error):
        create(test_host, props)
    assert props["marker"] not in test_host.uploads
    assert test_host.volumes() == set()


def test_an_upload_that_breaks_leaves_no_marker_and_no_volume(
    test_host: TestHost, server: FileServer
) -> None:
    test_host.fail_upload_after = 2000
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    with pytest.raises(libvirt.libvirtError, match="broke off"):
        create(test_host, props)
    assert test_host.uploads == [] and test_host.volumes() == set()


def test_a_failed_marker_write_removes_the_base(test_host: TestHost, server: FileServer) -> None:
    class Failing(BaseImageProvider):
        @staticmethod
        def _write_marker(conn: Any, pool: Any, name: str, digest: str, made: list[str]) -> None:
            raise libvirt.libvirtError("connection lost before the marker")

    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    with pytest.raises(libvirt.libvirtError, match="before the marker"):
        Failing().create(props)
    assert test_host.volumes() == set()


def test_a_base_without_marker_is_fetched_again(test_host: TestHost, server: FileServer) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    test_host.add_volume(props["volume"], IMAGE[:100], fmt="qcow2")  # a killed download
    outs = create(test_host, props)
    assert outs["cached"] is False and test_host.contents[outs["path"]] == IMAGE
    assert server.count("/disk.qcow2") == 1


def test_read_trusts_only_a_base_with_its_marker(test_host: TestHost, server: FileServer) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    outs = create(test_host, props)
    provider = BaseImageProvider()
    assert dict(provider.read(props["volume"], outs).outs or {}) == outs
    test_host.raw.storagePoolLookupByName(POOL).storageVolLookupByName(props["marker"]).delete(0)
    assert provider.read(props["volume"], outs).id == ""


def test_delete_keeps_the_cache_or_removes_both_volumes(
    test_host: TestHost, server: FileServer
) -> None:
    url = server.add("/disk.qcow2", data=IMAGE)
    kept = create(test_host, inputs(test_host, url, keep=True))
    BaseImageProvider().delete(kept["volume"], kept)
    assert test_host.volumes() == {kept["volume"], kept["marker"]}
    gone = kept | {"keep": False}
    BaseImageProvider().delete(gone["volume"], gone)
    assert test_host.volumes() == set()


def test_delete_refuses_while_an_overlay_backs_onto_the_base(
    test_host: TestHost, server: FileServer
) -> None:
    outs = create(test_host, inputs(test_host, server.add("/disk.qcow2", data=IMAGE)))
    pool = test_host.raw.storagePoolLookupByName(POOL)
    pool.createXML(
        volume_xml("proxy-0123456789.qcow2", 2 << 30, "qcow2", (outs["path"], "qcow2")), 0
    )
    with pytest.raises(InUseError, match=r"still the backing file of proxy-0123456789\.qcow2"):
        BaseImageProvider().delete(outs["volume"], outs)
    assert {outs["volume"], outs["marker"]} <= test_host.volumes()


def test_diff_replaces_on_content_and_updates_a_mirror_in_place(test_host: TestHost) -> None:
    olds = inputs(test_host, "http://a.example/disk.qcow2")
    mirror = inputs(test_host, "http://b.example/disk.qcow2")  # same sha256: same volume
    diff = BaseImageProvider().diff("v", olds, mirror)
    assert diff.changes is True and diff.replaces == []
    other = inputs(test_host, "http://a.example/disk.qcow2", sha256="1" * 64)
    assert set(BaseImageProvider().diff("v", olds, other).replaces or []) == {
        "sha256",
        "volume",
        "marker",
    }
