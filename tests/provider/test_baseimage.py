"""BaseImage through the engine's gRPC path against the testbed's libvirtd,
images served by a real HTTP server on loopback; every effect checked on the
host: the pool directory listed and the files read as root, qemu-img on them,
and libvirt's own view over SSH as the testbed user."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import libvirt
import pytest

from providers.kvm.access import HostAccess
from providers.kvm.baseimage import BaseImageProvider
from providers.kvm.basevolumes import write_marker
from providers.kvm.volumes import MIB, volume_xml
from tests.harness.engine import ProviderError, ProviderProcess
from tests.support.baseimages import (
    URN,
    LogWindow,
    create,
    inputs,
    names_of,
    random_qcow2,
    random_raw,
    serve,
    sha256_of,
)
from tests.support.http import FileServer
from tests.support.testbed import Testbed

pytestmark = pytest.mark.integration
libvirt.registerErrorHandler(lambda _c, _e: None, None)


class FailingMarkerProvider(BaseImageProvider):
    """Fails at the very last step, after the base is uploaded and verified
    (pickled by reference: the provider process imports this module)."""

    @staticmethod
    def _write_marker(conn: Any, pool: Any, name: str, digest: str, made: list[str]) -> None:
        write_marker(conn, pool, name, digest, made)
        raise libvirt.libvirtError("injected failure after writing the marker")


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[ProviderProcess]:
    with ProviderProcess(env={"EGRESS_PROXIES_LOG": "debug"}, rpc_timeout=300) as process:
        yield process


def pool_files(testbed: Testbed) -> set[str]:
    """What is really in the pool's directory on the host."""
    return set(os.listdir(testbed.pool_path))


def vol_xml(testbed: Testbed, name: str) -> str:
    result = testbed.virsh("vol-dumpxml", "--pool", testbed.pool, name)
    assert result.returncode == 0, result.stderr
    return result.stdout


def qemu_img_info(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        ["qemu-img", "info", "--output=json", str(path)], capture_output=True, text=True, check=True
    )
    info: dict[str, Any] = json.loads(out.stdout)
    return info


def timed(action: Callable[[], Any]) -> float:
    """Seconds the call took, as the engine would wait for it (check and create)."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def failure(call: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        call()
    return info.value


# -- fetch and cache --------------------------------------------------------------------------


def test_first_fetch_lands_exactly_then_the_cache_serves_it(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    props = inputs(access, image.url, image.digest)
    volume, marker = names_of(props)
    outs: dict[str, Any] = {}
    log = LogWindow(engine)
    fresh_s = timed(lambda: outs.update(create(engine, props, made)))
    fresh_rpcs = log.rpcs()

    assert server.count(image.path) == 1
    assert {volume, marker} <= pool_files(testbed)
    host_file = testbed.pool_path / volume
    assert outs["path"] == str(host_file)
    assert outs["digest"] == image.digest and outs["size"] == image.size
    assert outs["cached"] is False
    # Byte-exact on the host, a sound qcow2, and the marker holds the digest.
    assert sha256_of(host_file) == image.digest
    assert (testbed.pool_path / marker).read_text() == image.digest
    subprocess.run(
        ["qemu-img", "check", "-q", "-f", "qcow2", str(host_file)], check=True, capture_output=True
    )
    info = qemu_img_info(host_file)
    assert info["format"] == "qcow2" and info["virtual-size"] == 64 * MIB
    # libvirt's view, before and after a pool refresh: the image's own header.
    for refresh in (False, True):
        if refresh:
            assert testbed.virsh("pool-refresh", testbed.pool).returncode == 0
        xml = vol_xml(testbed, volume)
        assert "<format type='qcow2'/>" in xml
        assert f"<capacity unit='bytes'>{64 * MIB}</capacity>" in xml
        assert f"<physical unit='bytes'>{image.size}</physical>" in xml
    assert "fetching base image into host pool" in log.text
    assert re.search(rf"base image fetched into host pool path={host_file} .*sha256=", log.text)

    log = LogWindow(engine)
    again: dict[str, Any] = {}
    cached_s = timed(lambda: again.update(create(engine, props, made)))
    cached_rpcs = log.rpcs()
    assert server.count(image.path) == 1  # no second download
    assert again["cached"] is True
    assert {k: again[k] for k in ("path", "digest", "size")} == {
        k: outs[k] for k in ("path", "digest", "size")
    }
    assert re.search(r"base image cached path=\S+ size=\S+ MiB \(\d+ bytes\)", log.text)

    log = LogWindow(engine)
    read = engine.read(volume, URN, again)
    read_rpcs = log.rpcs()
    assert read.id == volume and read.properties["digest"] == image.digest

    print(f"\nfirst fetch of {image.size} bytes {fresh_s:.3f} s, cache hit {cached_s:.3f} s")
    print(f"RPCs: fresh create {len(fresh_rpcs)} {fresh_rpcs}")
    print(f"RPCs: cached create {len(cached_rpcs)} {cached_rpcs}")
    print(f"RPCs: read {len(read_rpcs)} {read_rpcs}")
    # The lock of one writer per base (baselock.py) adds four: create and
    # stamp it, find and delete it at the end; the upload's own connection
    # (OpenSSH's forward) one, to find the volume.
    assert len(fresh_rpcs) <= 15
    assert len(cached_rpcs) <= 5
    assert len(read_rpcs) <= 5

    engine.delete(volume, URN, again)
    assert not {volume, marker} & pool_files(testbed)


def test_raw_image_with_progress_lines(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    # 12 MiB paced to 5 s: a long download, whose progress is logged.
    image = serve(server, random_raw(tmp_path, 12), rate=12 * MIB / 5)
    props = inputs(access, image.url, None, "raw")  # no digest configured: named by URL
    log = LogWindow(engine)
    outs = create(engine, props, made)
    volume, marker = names_of(props)
    assert volume.startswith("egress-base-u") and volume.endswith(".raw")
    assert outs["digest"] == image.digest and outs["size"] == image.size
    assert sha256_of(testbed.pool_path / volume) == image.digest
    assert (testbed.pool_path / marker).read_text() == image.digest
    lines = re.findall(
        r"(\d\d:\d\d:\d\d,\d+) INFO kvm .* fetching base image: "
        r"\S+ MiB of 12.0 MiB \((\d+)%\) at [\d.]+ MiB/s",
        log.text,
    )
    assert 1 <= len(lines) <= 3
    percents = [int(p) for _, p in lines]
    assert percents == sorted(percents) and all(0 < p < 100 for p in percents)
    times = [datetime.strptime(t, "%H:%M:%S,%f") for t, _ in lines]
    assert all((b - a).total_seconds() >= 1.9 for a, b in itertools.pairwise(times))
    engine.delete(volume, URN, outs)
    assert not {volume, marker} & pool_files(testbed)


def test_without_content_length(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path), send_length=False)
    props = inputs(access, image.url, image.digest)
    log = LogWindow(engine)
    outs = create(engine, props, made)
    assert "size=unknown" in log.text
    assert outs["size"] == image.size
    assert sha256_of(testbed.pool_path / props["volume"]) == image.digest
    engine.delete(props["volume"], URN, outs)


# -- broken downloads and leftovers -----------------------------------------------------------


def test_cut_off_download_leaves_nothing_and_the_next_create_fetches(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    file = random_qcow2(tmp_path)
    image = serve(server, file, cut_after=file.stat().st_size // 2)
    props = inputs(access, image.url)  # no digest: only the stream can tell it broke
    volume, marker = names_of(props)
    error = failure(lambda: create(engine, props, made))
    assert error.exception_type == "providers.kvm.errors.ImageError"
    assert f"download of {image.url} broke off after" in error.message
    assert server.count(image.path) == 1
    assert not {volume, marker} & pool_files(testbed)

    server.add(image.path, file=file)  # the mirror recovers
    outs = create(engine, props, made)
    assert server.count(image.path) == 2
    assert outs["digest"] == image.digest and outs["cached"] is False
    assert sha256_of(testbed.pool_path / volume) == image.digest
    engine.delete(volume, URN, outs)


def test_base_without_marker_is_fetched_again(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    pool: Any,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    props = inputs(access, image.url, image.digest)
    volume, marker = names_of(props)
    made.extend((volume, marker))
    pool.createXML(volume_xml(volume, MIB, "raw"), 0)  # what a crash mid-download leaves
    log = LogWindow(engine)
    outs = create(engine, props, made)
    assert "a base volume without marker (an interrupted download): removing it" in log.text
    assert server.count(image.path) == 1 and outs["cached"] is False
    assert sha256_of(testbed.pool_path / volume) == image.digest
    engine.delete(volume, URN, outs)


def test_marker_that_disagrees_with_the_configured_digest_is_fetched_again(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    pool: Any,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    props = inputs(access, image.url, image.digest)
    volume, marker = names_of(props)
    made.extend((volume, marker))
    # Same name (16 hex of the digest), another full digest: not this image.
    other = image.digest[:16] + "0" * 48
    pool.createXML(volume_xml(volume, MIB, "raw"), 0)
    stale = pool.createXML(volume_xml(marker, 64, "raw"), 0)
    stream = pool.connect().newStream(0)
    stale.upload(stream, 0, 64, 0)
    stream.send(other.encode())
    stream.finish()
    log = LogWindow(engine)
    outs = create(engine, props, made)
    assert f"the marker says sha256 {other}, the configured sha256 is {image.digest}" in log.text
    assert server.count(image.path) == 1 and outs["digest"] == image.digest
    assert (testbed.pool_path / marker).read_text() == image.digest
    engine.delete(volume, URN, outs)


def test_sha256_mismatch_names_both_digests_and_leaves_nothing(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    wrong = hashlib.sha256(os.urandom(16)).hexdigest()
    props = inputs(access, image.url, wrong)
    before = pool_files(testbed)
    error = failure(lambda: create(engine, props, made))
    assert error.exception_type == "providers.kvm.errors.ImageError"
    assert f"sha256 mismatch: expected {wrong}, got {image.digest}" in error.message
    assert pool_files(testbed) - before == set()
    assert not set(names_of(props)) & pool_files(testbed)


def test_no_room_in_the_pool_is_refused_before_any_volume(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path), length=2**50)  # a 1 PiB promise
    props = inputs(access, image.url, image.digest)
    log = LogWindow(engine)
    error = failure(lambda: create(engine, props, made))
    assert error.exception_type == "providers.kvm.errors.CapacityError"
    assert access.where in error.message
    assert f"pool {testbed.pool!r} has" in error.message
    assert "available, base image" in error.message and "needs 1048576.00 GiB" in error.message
    assert log.rpcs().count("virStorageVolCreateXML") == 1  # the lock's only
    assert not set(names_of(props)) & pool_files(testbed)


def test_wrong_content_and_http_errors_are_refused_before_any_volume(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
) -> None:
    page = server.add(f"/{uuid.uuid4().hex[:8]}/image.qcow2", data=b"<html>moved</html>" * 10)
    log = LogWindow(engine)
    error = failure(lambda: create(engine, inputs(access, page), made))
    assert f"{page} is not a qcow2 image (it starts with b'<html>moved</htm')" in error.message
    missing = server.url(f"/{uuid.uuid4().hex[:8]}/missing.qcow2")
    error = failure(lambda: create(engine, inputs(access, missing), made))
    assert error.message.startswith(f"could not fetch {missing}: HTTP 404 Not Found")
    assert log.rpcs().count("virStorageVolCreateXML") == 2  # each create's lock only
    assert not set(made) & pool_files(testbed)


def test_qcow2_smaller_than_libvirts_own_header_is_refused(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    # libvirt makes a qcow2 volume with qemu-img create (a ~192 KiB file) and
    # an upload overwrites it without truncating: a smaller image would keep
    # that file's tail, and the bytes on disk would not be the ones hashed.
    tiny = tmp_path / "tiny.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", str(tiny), "1M"],
        check=True,
    )
    image = serve(server, tiny)
    props = inputs(access, image.url)
    error = failure(lambda: create(engine, props, made))
    assert re.search(
        r"after uploading 1\d\d\d: libvirt pre-writes a qcow2 file of \d+ bytes", error.message
    )
    assert not set(names_of(props)) & pool_files(testbed)


def test_failure_at_the_last_step_removes_base_and_marker(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    props = inputs(access, image.url, image.digest, provider=FailingMarkerProvider())
    error = failure(lambda: create(engine, props, made))
    assert "injected failure after writing the marker" in error.message
    assert f"base image {props['volume']} in pool {testbed.pool!r}" in error.message
    assert not set(names_of(props)) & pool_files(testbed)


# -- delete, rotation, refresh ----------------------------------------------------------------


def overlay_on(pool: Any, base_path: str, made: list[str]) -> str:
    name = f"baseimage-test-{uuid.uuid4().hex[:8]}.qcow2"
    made.append(name)
    pool.createXML(volume_xml(name, 128 * MIB, "qcow2", (base_path, "qcow2")), 0)
    return name


def test_delete_is_refused_while_an_overlay_backs_onto_the_base(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    pool: Any,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    outs = create(engine, inputs(access, image.url, image.digest), made)
    volume, marker = names_of(outs)
    overlay = overlay_on(pool, outs["path"], made)
    error = failure(lambda: engine.delete(volume, URN, outs))
    assert error.exception_type == "providers.kvm.errors.InUseError"
    assert f"base image {volume} ({outs['path']})" in error.message
    assert f"still the backing file of {overlay}" in error.message
    assert {volume, marker, overlay} <= pool_files(testbed)

    pool.storageVolLookupByName(overlay).delete(0)
    engine.delete(volume, URN, outs)
    assert not {volume, marker} & pool_files(testbed)
    engine.delete(volume, URN, outs)  # already gone: fine


def test_a_kept_base_stays_as_a_cache_and_the_next_create_uses_it(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    pool: Any,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    outs = create(engine, inputs(access, image.url, image.digest, keep=True), made)
    assert outs["keep"] is True and outs["cached"] is False
    overlay = overlay_on(pool, outs["path"], made)  # in use or not, a kept base is not touched
    window = LogWindow(engine)
    engine.delete(outs["volume"], URN, outs)
    assert {*names_of(outs), overlay} <= pool_files(testbed)
    assert "kept in pool" in window.text and "base image deleted" not in window.text

    # Turning keep off is an in-place change; the next delete frees the space.
    off = inputs(access, image.url, image.digest, keep=False)
    diff = engine.diff(outs["volume"], URN, outs, off)
    assert diff.action == "update" and diff.replaces == []
    pool.storageVolLookupByName(overlay).delete(0)
    again = create(engine, off, made)
    assert again["cached"] is True and again["path"] == outs["path"]
    engine.delete(again["volume"], URN, again)
    assert not set(names_of(outs)) & pool_files(testbed)


def test_keep_must_be_a_boolean(engine: ProviderProcess, access: HostAccess) -> None:
    checked = engine.check(URN, {}, inputs(access, "http://127.0.0.1:1/x.qcow2", keep="yes"))
    assert checked.failures == [("keep", "must be true or false, got 'yes'")]


def test_rotation_keeps_the_old_base_until_its_overlays_are_gone(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    pool: Any,
    made: list[str],
    tmp_path: Path,
) -> None:
    old_image = serve(server, random_qcow2(tmp_path))
    old = create(engine, inputs(access, old_image.url, old_image.digest), made)
    overlays = [overlay_on(pool, old["path"], made) for _ in range(2)]

    new_image = serve(server, random_qcow2(tmp_path))
    new_inputs = inputs(access, new_image.url, new_image.digest)
    diff = engine.diff(old["volume"], URN, old, new_inputs)
    assert diff.action == "replace" and not diff.delete_before_replace
    assert set(diff.replaces) == {"url", "sha256", "volume", "marker"}
    new = create(engine, new_inputs, made)
    assert new["volume"] != old["volume"]
    assert {*names_of(old), *names_of(new), *overlays} <= pool_files(testbed)

    # The engine deletes the old base after the overlays moved; here they have not.
    error = failure(lambda: engine.delete(old["volume"], URN, old))
    assert f"still the backing file of {', '.join(sorted(overlays))}" in error.message
    pool.storageVolLookupByName(overlays[0]).delete(0)
    error = failure(lambda: engine.delete(old["volume"], URN, old))
    assert f"still the backing file of {overlays[1]};" in error.message
    pool.storageVolLookupByName(overlays[1]).delete(0)
    engine.delete(old["volume"], URN, old)
    files = pool_files(testbed)
    assert not set(names_of(old)) & files and set(names_of(new)) <= files
    engine.delete(new["volume"], URN, new)


def test_refresh_reports_a_base_deleted_out_of_band_as_gone(
    engine: ProviderProcess,
    server: FileServer,
    testbed: Testbed,
    access: HostAccess,
    made: list[str],
    tmp_path: Path,
) -> None:
    image = serve(server, random_qcow2(tmp_path))
    outs = create(engine, inputs(access, image.url, image.digest), made)
    volume, marker = names_of(outs)
    read = engine.read(volume, URN, outs)
    assert read.id == volume and read.properties["path"] == outs["path"]
    # Only the marker gone: a broken base, which the next create replaces.
    assert testbed.virsh("vol-delete", "--pool", testbed.pool, marker).returncode == 0
    assert engine.read(volume, URN, outs).id == ""
    assert testbed.virsh("vol-delete", "--pool", testbed.pool, volume).returncode == 0
    gone = engine.read(volume, URN, outs)
    assert gone.id == "" and set(gone.properties) <= {"__provider"}
    engine.delete(volume, URN, outs)  # already gone: fine


# -- check and diff ---------------------------------------------------------------------------


def test_check_names_each_bad_input(engine: ProviderProcess, access: HostAccess) -> None:
    good = inputs(access, "https://images.example/debian.qcow2")
    bad = {
        **good,
        "url": "ftp://images.example/debian.qcow2",
        "sha256": "ABC",
        "format": "vmdk",
    }
    failures = dict(engine.check(URN, {}, bad).failures)
    assert set(failures) == {"url", "sha256", "format"}
    assert "http or https" in failures["url"]
    assert "64 lowercase hex" in failures["sha256"]
    assert "qcow2" in failures["format"]
    renamed = {**good, "volume": "my-disk.qcow2"}
    failures = dict(engine.check(URN, {}, renamed).failures)
    assert list(failures) == ["volume"] and good["volume"] in failures["volume"]
    assert engine.check(URN, {}, good).failures == []


def test_diff_replaces_only_when_the_content_or_the_host_changes(
    engine: ProviderProcess, access: HostAccess
) -> None:
    digest = "ab" * 32
    url = "https://images.example/debian.qcow2"
    olds = {
        **inputs(access, url, digest),
        "path": "/pool/x",
        "digest": digest,
        "size": 1.0,
        "cached": False,
    }
    # As state returns them: numbers as floats.
    olds["host"] = {**olds["host"], "port": float(access.port)}
    assert engine.diff("x", URN, olds, inputs(access, url, digest)).action == "same"
    mirror = engine.diff("x", URN, olds, inputs(access, "https://mirror.example/d.qcow2", digest))
    assert mirror.action == "update"  # same digest, same name: no new download
    updated = engine.update(
        "x", URN, olds, inputs(access, "https://mirror.example/d.qcow2", digest)
    )
    assert updated["url"] == "https://mirror.example/d.qcow2" and updated["path"] == "/pool/x"
    key_moved = inputs(dataclasses.replace(access, key_file="/elsewhere/key"), url, digest)
    assert engine.diff("x", URN, olds, key_moved).action == "update"
    other_host = inputs(dataclasses.replace(access, address="10.0.0.9"), url, digest)
    moved = engine.diff("x", URN, olds, other_host)
    assert moved.replaces == ["host"] and not moved.delete_before_replace
    raw = engine.diff("x", URN, olds, inputs(access, url, digest, "raw"))
    assert set(raw.replaces) == {"format", "volume", "marker"}
    # Another digest that shares the 16 hex of the name: same volumes, so the
    # old must go first or its delete would remove the new one.
    same_name = engine.diff("x", URN, olds, inputs(access, url, "ab" * 8 + "cd" * 24))
    assert same_name.replaces == ["sha256"] and same_name.delete_before_replace
