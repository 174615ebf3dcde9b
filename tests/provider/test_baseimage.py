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
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import libvirt
import pytest

from providers.kvm.access import HostAccess
from providers.kvm.baseimage import BaseImageProvider
from providers.kvm.basevolumes import write_marker
from providers.kvm.volumes import MIB, volume_xml
from proxyinfra.names import base_volume
from tests.harness.engine import ProviderError, ProviderProcess
from tests.support.baseimages import (
    URN,
    BaseImageLab,
    LogWindow,
    inputs,
    names_of,
    random_qcow2,
    sha256_of,
)
from tests.support.testbed import Testbed

# Downloads paced to seconds, uploads of several MiB over SSH: long RPCs.
pytestmark = [pytest.mark.integration, pytest.mark.provider_engine(rpc_timeout=300)]
libvirt.registerErrorHandler(lambda _c, _e: None, None)


class FailingMarkerProvider(BaseImageProvider):
    """Fails at the very last step, after the base is uploaded and verified
    (pickled by reference: the provider process imports this module)."""

    @staticmethod
    def _write_marker(conn: Any, pool: Any, name: str, digest: str, made: list[str]) -> None:
        write_marker(conn, pool, name, digest, made)
        raise libvirt.libvirtError("injected failure after writing the marker")


# -- helpers ----------------------------------------------------------------------------------


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


def failure(call: Callable[[], Any]) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        call()
    return info.value


def timed(action: Callable[[], Any]) -> float:
    """Seconds the call took, as the engine would wait for it (check and create)."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


# -- fetch and cache --------------------------------------------------------------------------


def test_first_fetch_lands_exactly_then_the_cache_serves_it(lab: BaseImageLab) -> None:
    testbed, engine = lab.testbed, lab.engine
    image = lab.qcow2()
    props = lab.inputs(image.url, image.digest)
    volume, marker = names_of(props)
    outs: dict[str, Any] = {}
    log = LogWindow(engine)
    fresh_s = timed(lambda: outs.update(lab.create(props)))
    fresh_rpcs = log.rpcs()

    assert lab.server.count(image.path) == 1
    assert {volume, marker} <= lab.files()
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
    cached_s = timed(lambda: again.update(lab.create(props)))
    cached_rpcs = log.rpcs()
    assert lab.server.count(image.path) == 1  # no second download
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

    lab.delete(again)
    assert not {volume, marker} & lab.files()


def test_raw_image_with_progress_lines(lab: BaseImageLab) -> None:
    # 12 MiB paced to 5 s: a long download, whose progress is logged.
    image = lab.raw(12, rate=12 * MIB / 5)
    props = lab.inputs(image.url, None, "raw")  # no digest configured: named by URL
    log = LogWindow(lab.engine)
    outs = lab.create(props)
    volume, marker = names_of(props)
    assert volume.startswith("egress-base-u") and volume.endswith(".raw")
    assert outs["digest"] == image.digest and outs["size"] == image.size
    assert sha256_of(lab.testbed.pool_path / volume) == image.digest
    assert (lab.testbed.pool_path / marker).read_text() == image.digest
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
    lab.delete(outs)
    assert not {volume, marker} & lab.files()


def test_without_content_length(lab: BaseImageLab) -> None:
    image = lab.qcow2(send_length=False)
    props = lab.inputs(image.url, image.digest)
    log = LogWindow(lab.engine)
    outs = lab.create(props)
    assert "size=unknown" in log.text
    assert outs["size"] == image.size
    assert sha256_of(lab.testbed.pool_path / props["volume"]) == image.digest
    lab.delete(outs)


# -- broken downloads and leftovers -----------------------------------------------------------


def test_cut_off_download_leaves_nothing_and_the_next_create_fetches(lab: BaseImageLab) -> None:
    file = random_qcow2(lab.scratch)
    image = lab.serve(file, cut_after=file.stat().st_size // 2)
    props = lab.inputs(image.url)  # no digest: only the stream can tell it broke
    volume, marker = names_of(props)
    error = lab.failure(props)
    assert error.exception_type == "providers.kvm.errors.ImageError"
    assert f"download of {image.url} broke off after" in error.message
    assert lab.server.count(image.path) == 1
    assert not {volume, marker} & lab.files()

    lab.server.add(image.path, file=file)  # the mirror recovers
    outs = lab.create(props)
    assert lab.server.count(image.path) == 2
    assert outs["digest"] == image.digest and outs["cached"] is False
    assert sha256_of(lab.testbed.pool_path / volume) == image.digest
    lab.delete(outs)


def test_base_without_marker_is_fetched_again(lab: BaseImageLab) -> None:
    image = lab.qcow2()
    props = lab.inputs(image.url, image.digest)
    volume, marker = names_of(props)
    lab.made.extend((volume, marker))
    lab.pool.createXML(volume_xml(volume, MIB, "raw"), 0)  # what a crash mid-download leaves
    log = LogWindow(lab.engine)
    outs = lab.create(props)
    assert "a base volume without marker (an interrupted download): removing it" in log.text
    assert lab.server.count(image.path) == 1 and outs["cached"] is False
    assert sha256_of(lab.testbed.pool_path / volume) == image.digest
    lab.delete(outs)


def test_marker_that_disagrees_with_the_configured_digest_is_fetched_again(
    lab: BaseImageLab,
) -> None:
    image = lab.qcow2()
    props = lab.inputs(image.url, image.digest)
    volume, marker = names_of(props)
    lab.made.extend((volume, marker))
    # Same name (16 hex of the digest), another full digest: not this image.
    other = image.digest[:16] + "0" * 48
    lab.pool.createXML(volume_xml(volume, MIB, "raw"), 0)
    stale = lab.pool.createXML(volume_xml(marker, 64, "raw"), 0)
    stream = lab.pool.connect().newStream(0)
    stale.upload(stream, 0, 64, 0)
    stream.send(other.encode())
    stream.finish()
    log = LogWindow(lab.engine)
    outs = lab.create(props)
    assert f"the marker says sha256 {other}, the configured sha256 is {image.digest}" in log.text
    assert lab.server.count(image.path) == 1 and outs["digest"] == image.digest
    assert (lab.testbed.pool_path / marker).read_text() == image.digest
    lab.delete(outs)


def test_sha256_mismatch_names_both_digests_and_leaves_nothing(lab: BaseImageLab) -> None:
    image = lab.qcow2()
    wrong = hashlib.sha256(os.urandom(16)).hexdigest()
    props = lab.inputs(image.url, wrong)
    before = lab.files()
    error = lab.failure(props)
    assert error.exception_type == "providers.kvm.errors.ImageError"
    assert f"sha256 mismatch: expected {wrong}, got {image.digest}" in error.message
    # Only this image's names: the testbed's other workers make volumes in the
    # same pool meanwhile (a CI run saw another test's overlays and marker).
    ours = tuple(base_volume(image.url, key, "qcow2").split(".")[0] for key in (wrong, None))
    assert {name for name in lab.files() - before if name.startswith(ours)} == set()
    assert not set(names_of(props)) & lab.files()


def test_no_room_in_the_pool_is_refused_before_any_volume(lab: BaseImageLab) -> None:
    image = lab.qcow2(length=2**50)  # a 1 PiB promise
    props = lab.inputs(image.url, image.digest)
    log = LogWindow(lab.engine)
    error = lab.failure(props)
    assert error.exception_type == "providers.kvm.errors.CapacityError"
    assert lab.access.where in error.message
    assert f"pool {lab.testbed.pool!r} has" in error.message
    assert "available, base image" in error.message and "needs 1048576.00 GiB" in error.message
    assert log.rpcs().count("virStorageVolCreateXML") == 1  # the lock's only
    assert not set(names_of(props)) & lab.files()


def test_wrong_content_and_http_errors_are_refused_before_any_volume(lab: BaseImageLab) -> None:
    page = lab.server.add(f"/{uuid.uuid4().hex[:8]}/image.qcow2", data=b"<html>moved</html>" * 10)
    log = LogWindow(lab.engine)
    error = lab.failure(lab.inputs(page))
    assert f"{page} is not a qcow2 image (it starts with b'<html>moved</htm')" in error.message
    missing = lab.server.url(f"/{uuid.uuid4().hex[:8]}/missing.qcow2")
    error = lab.failure(lab.inputs(missing))
    assert error.message.startswith(f"could not fetch {missing}: HTTP 404 Not Found")
    assert log.rpcs().count("virStorageVolCreateXML") == 2  # each create's lock only
    assert not set(lab.made) & lab.files()


def test_qcow2_smaller_than_libvirts_own_header_is_refused(lab: BaseImageLab) -> None:
    # libvirt makes a qcow2 volume with qemu-img create (a ~192 KiB file) and
    # an upload overwrites it without truncating: a smaller image would keep
    # that file's tail, and the bytes on disk would not be the ones hashed.
    tiny = lab.scratch / "tiny.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", str(tiny), "1M"],
        check=True,
    )
    image = lab.serve(tiny)
    props = lab.inputs(image.url)
    error = lab.failure(props)
    assert re.search(
        r"after uploading 1\d\d\d: libvirt pre-writes a qcow2 file of \d+ bytes", error.message
    )
    assert not set(names_of(props)) & lab.files()


def test_failure_at_the_last_step_removes_base_and_marker(lab: BaseImageLab) -> None:
    image = lab.qcow2()
    props = lab.inputs(image.url, image.digest, provider=FailingMarkerProvider())
    error = lab.failure(props)
    assert "injected failure after writing the marker" in error.message
    assert f"base image {props['volume']} in pool {lab.testbed.pool!r}" in error.message
    assert not set(names_of(props)) & lab.files()


# -- delete, rotation, refresh ----------------------------------------------------------------


def overlay_on(lab: BaseImageLab, base_path: str) -> str:
    name = f"baseimage-test-{uuid.uuid4().hex[:8]}.qcow2"
    lab.made.append(name)
    lab.pool.createXML(volume_xml(name, 128 * MIB, "qcow2", (base_path, "qcow2")), 0)
    return name


def test_delete_is_refused_while_an_overlay_backs_onto_the_base(lab: BaseImageLab) -> None:
    image = lab.qcow2()
    outs = lab.create(lab.inputs(image.url, image.digest))
    volume, marker = names_of(outs)
    overlay = overlay_on(lab, outs["path"])
    error = failure(lambda: lab.delete(outs))
    assert error.exception_type == "providers.kvm.errors.InUseError"
    assert f"base image {volume} ({outs['path']})" in error.message
    assert f"still the backing file of {overlay}" in error.message
    assert {volume, marker, overlay} <= lab.files()

    lab.pool.storageVolLookupByName(overlay).delete(0)
    lab.delete(outs)
    assert not {volume, marker} & lab.files()
    lab.delete(outs)  # already gone: fine


def test_a_kept_base_stays_as_a_cache_and_the_next_create_uses_it(lab: BaseImageLab) -> None:
    image = lab.qcow2()
    outs = lab.create(lab.inputs(image.url, image.digest, keep=True))
    assert outs["keep"] is True and outs["cached"] is False
    overlay = overlay_on(lab, outs["path"])  # in use or not, a kept base is not touched
    window = LogWindow(lab.engine)
    lab.delete(outs)
    assert {*names_of(outs), overlay} <= lab.files()
    assert "kept in pool" in window.text and "base image deleted" not in window.text

    # Turning keep off is an in-place change; the next delete frees the space.
    off = lab.inputs(image.url, image.digest, keep=False)
    diff = lab.engine.diff(outs["volume"], URN, outs, off)
    assert diff.action == "update" and diff.replaces == []
    lab.pool.storageVolLookupByName(overlay).delete(0)
    again = lab.create(off)
    assert again["cached"] is True and again["path"] == outs["path"]
    lab.delete(again)
    assert not set(names_of(outs)) & lab.files()


def test_keep_must_be_a_boolean(engine: ProviderProcess, access: HostAccess) -> None:
    checked = engine.check(URN, {}, inputs(access, "http://127.0.0.1:1/x.qcow2", keep="yes"))
    assert checked.failures == [("keep", "must be true or false, got 'yes'")]


def test_rotation_keeps_the_old_base_until_its_overlays_are_gone(lab: BaseImageLab) -> None:
    old_image = lab.qcow2()
    old = lab.create(lab.inputs(old_image.url, old_image.digest))
    overlays = [overlay_on(lab, old["path"]) for _ in range(2)]

    new_image = lab.qcow2()
    new_inputs = lab.inputs(new_image.url, new_image.digest)
    diff = lab.engine.diff(old["volume"], URN, old, new_inputs)
    assert diff.action == "replace" and not diff.delete_before_replace
    assert set(diff.replaces) == {"url", "sha256", "volume", "marker"}
    new = lab.create(new_inputs)
    assert new["volume"] != old["volume"]
    assert {*names_of(old), *names_of(new), *overlays} <= lab.files()

    # The engine deletes the old base after the overlays moved; here they have not.
    error = failure(lambda: lab.delete(old))
    assert f"still the backing file of {', '.join(sorted(overlays))}" in error.message
    lab.pool.storageVolLookupByName(overlays[0]).delete(0)
    error = failure(lambda: lab.delete(old))
    assert f"still the backing file of {overlays[1]};" in error.message
    lab.pool.storageVolLookupByName(overlays[1]).delete(0)
    lab.delete(old)
    files = lab.files()
    assert not set(names_of(old)) & files and set(names_of(new)) <= files
    lab.delete(new)


def test_refresh_reports_a_base_deleted_out_of_band_as_gone(lab: BaseImageLab) -> None:
    testbed, engine = lab.testbed, lab.engine
    image = lab.qcow2()
    outs = lab.create(lab.inputs(image.url, image.digest))
    volume, marker = names_of(outs)
    read = engine.read(volume, URN, outs)
    assert read.id == volume and read.properties["path"] == outs["path"]
    # Only the marker gone: a broken base, which the next create replaces.
    assert testbed.virsh("vol-delete", "--pool", testbed.pool, marker).returncode == 0
    assert engine.read(volume, URN, outs).id == ""
    assert testbed.virsh("vol-delete", "--pool", testbed.pool, volume).returncode == 0
    gone = engine.read(volume, URN, outs)
    assert gone.id == "" and set(gone.properties) <= {"__provider"}
    lab.delete(outs)  # already gone: fine


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
