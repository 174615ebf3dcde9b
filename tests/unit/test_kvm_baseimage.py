"""BaseImage's create, cache, read, delete and failed-create cleanup,
in-process against libvirt's test driver (tests/support/testdriver.py) and a
real HTTP server on loopback. The same paths on a real libvirtd over SSH,
with real volume uploads: tests/provider/test_baseimage.py."""

from __future__ import annotations

import contextlib
import hashlib
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import libvirt
import pytest

from providers.kvm import baseimage, baselock
from providers.kvm.baseimage import BaseImageArgs, BaseImageProvider
from providers.kvm.baselock import _stamp, lock_volume, try_lock
from providers.kvm.errors import ImageError, InUseError
from providers.kvm.volumes import upload, volume_xml
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


def data_uploads(host: TestHost) -> list[str]:
    """Uploads of image and marker, in order (not the lock's heartbeats)."""
    return [name for name in host.uploads if not name.endswith(".lock")]


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
    # The marker is the last thing written, after the whole image arrived
    # (the lock beside them is rewritten as the download goes: see below).
    assert data_uploads(test_host) == [props["volume"], props["marker"]]
    assert test_host.volumes() == {props["volume"], props["marker"]}  # lock gone


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
    assert data_uploads(test_host) == [] and test_host.volumes() == set()


@pytest.mark.parametrize("sha256", [DIGEST, None], ids=["digest", "no-digest"])
def test_a_short_upload_leaves_no_marker_and_no_volume(
    test_host: TestHost, server: FileServer, monkeypatch: pytest.MonkeyPatch, sha256: str | None
) -> None:
    # The whole image is downloaded and hashed (the digest matches), but only
    # its first 1000 bytes reach the volume: only the byte count tells.
    def short(conn: Any, vol: Any, chunks: Iterator[bytes], length: int = 0) -> int:
        return upload(conn, vol, [b"".join(chunks)[:1000]], length)

    monkeypatch.setattr(baseimage, "upload", short)
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE), sha256=sha256)
    with pytest.raises(ImageError, match="gave 1000 bytes, Content-Length said"):
        create(test_host, props)
    assert props["marker"] not in test_host.uploads
    assert test_host.volumes() == set()


def test_an_image_shorter_than_the_file_libvirt_made_leaves_no_marker_and_no_volume(
    test_host: TestHost, server: FileServer
) -> None:
    # libvirt writes a fresh qcow2 file that the upload overwrites without
    # truncating: the volume would keep a tail that is not the image's.
    test_host.prewrite_qcow2 = len(IMAGE) + 65536
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    with pytest.raises(ImageError, match="pre-writes a qcow2 file"):
        create(test_host, props)
    assert props["marker"] not in test_host.uploads
    assert test_host.volumes() == set()


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


# -- one writer per base on a host (providers/kvm/baselock.py) ------------------------------


def test_two_creates_at_once_download_once(test_host: TestHost, server: FileServer) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE, rate=20_000))
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: create(test_host, props), range(2))
    assert server.count("/disk.qcow2") == 1
    assert {first["cached"], second["cached"]} == {True, False}
    assert first["path"] == second["path"]
    assert data_uploads(test_host) == [props["volume"], props["marker"]]  # one upload each
    assert test_host.volumes() == {props["volume"], props["marker"]}


def test_a_live_lock_is_waited_for_and_its_result_used(
    test_host: TestHost, server: FileServer
) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    pool = test_host.libvirt().storagePoolLookupByName(POOL)
    lock = lock_volume(props["volume"])
    assert try_lock(test_host.libvirt(), pool, lock)  # another writer at work

    def other_writer() -> None:
        for _ in range(3):  # its heartbeat, then its result
            time.sleep(0.3)
            _stamp(test_host.libvirt(), pool.storageVolLookupByName(lock))
        test_host.add_volume(props["volume"], IMAGE, fmt="qcow2")
        test_host.add_volume(props["marker"], DIGEST.encode())
        pool.storageVolLookupByName(lock).delete(0)

    writer = threading.Thread(target=other_writer)
    writer.start()
    with patched(baselock, POLL=0.05, STALE=0.8):
        outs = create(test_host, props)
    writer.join()
    assert outs["cached"] is True and server.count("/disk.qcow2") == 0


def test_a_stale_lock_is_taken_over(test_host: TestHost, server: FileServer) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE))
    pool = test_host.libvirt().storagePoolLookupByName(POOL)
    # A writer that died: its lock and half an image, never touched again.
    assert try_lock(test_host.libvirt(), pool, lock_volume(props["volume"]))
    test_host.add_volume(props["volume"], IMAGE[:100], fmt="qcow2")
    with patched(baselock, POLL=0.05, STALE=0.5):
        outs = create(test_host, props)
    assert outs["cached"] is False and test_host.contents[outs["path"]] == IMAGE
    assert test_host.volumes() == {props["volume"], props["marker"]}


def test_a_failed_create_releases_its_lock(test_host: TestHost, server: FileServer) -> None:
    props = inputs(test_host, server.add("/disk.qcow2", data=IMAGE), sha256="0" * 64)
    with pytest.raises(ImageError, match="sha256 mismatch"):
        create(test_host, props)
    assert test_host.volumes() == set()


@contextlib.contextmanager
def patched(module: Any, **values: float) -> Iterator[None]:
    before = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)
