"""The NoCloud seed ISO: read back by pycdlib and by real tools (blkid,
isoinfo), the way cloud-init finds it, and reproducible byte for byte."""

from __future__ import annotations

import hashlib
import io
import shlex
import subprocess
import time
from pathlib import Path

import pycdlib
import pytest

from providers.kvm.iso import build_nocloud_iso
from proxyinfra.cloudinit import default_vendor_data, render_meta_data

USER_DATA = "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: 'héllo proxy'\n"
META_DATA = render_meta_data("proxy-0123456789", "proxy-0123456789")
NETWORK = "version: 2\nethernets:\n  eth0: {dhcp4: true}\n"


def full_iso() -> bytes:
    return build_nocloud_iso(USER_DATA, META_DATA, default_vendor_data(), NETWORK)


@pytest.fixture
def iso_file(tmp_path: Path) -> Path:
    path = tmp_path / "seed.iso"
    path.write_bytes(full_iso())
    return path


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def blkid(path: Path) -> dict[str, str]:
    """What cloud-init's find_devs_with sees: blkid's low-level probe of the bytes."""
    words = shlex.split(run("blkid", "-p", "-o", "export", str(path)))  # values are escaped
    return dict(word.split("=", 1) for word in words)


def test_blkid_finds_label_cidata_and_type_iso9660(iso_file: Path) -> None:
    found = blkid(iso_file)
    assert found["TYPE"] == "iso9660"
    # blkid prefers the Joliet label when it differs: both must say cidata.
    assert found["LABEL"] == "cidata"
    assert found["VERSION"] == "Joliet Extension"


@pytest.mark.parametrize("reader", ["-J", "-R"])
def test_isoinfo_reads_every_document_by_its_nocloud_name(iso_file: Path, reader: str) -> None:
    expected = {
        "user-data": USER_DATA,
        "meta-data": META_DATA,
        "vendor-data": default_vendor_data(),
        "network-config": NETWORK,
    }
    listing = run("isoinfo", reader, "-f", "-i", str(iso_file)).split()
    assert sorted(listing) == sorted(f"/{name}" for name in expected)
    for name, text in expected.items():
        raw = subprocess.run(
            ["isoinfo", reader, "-i", str(iso_file), "-x", f"/{name}"],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
        assert raw.decode() == text, name


def test_rock_ridge_files_are_root_only(iso_file: Path) -> None:
    listing = run("isoinfo", "-R", "-l", "-i", str(iso_file))
    modes = {line.split()[-1]: line.split()[0] for line in listing.splitlines() if "-data" in line}
    assert modes == {name: "-r--------" for name in ("user-data", "meta-data", "vendor-data")}


def test_pycdlib_reads_it_back() -> None:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(full_iso()))
    try:
        assert iso.pvd.volume_identifier.rstrip(b" ") == b"cidata"
        for facade_path, name, text in (
            ("joliet_path", "/user-data", USER_DATA),
            ("rr_path", "/meta-data", META_DATA),
            ("iso_path", "/NETWORK_CONFIG.;1", NETWORK),
        ):
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, **{facade_path: name})
            assert out.getvalue().decode() == text
    finally:
        iso.close()


def test_optional_documents_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "minimal.iso"
    path.write_bytes(build_nocloud_iso(USER_DATA, META_DATA))
    listing = run("isoinfo", "-J", "-f", "-i", str(path)).split()
    assert sorted(listing) == ["/meta-data", "/user-data"]


def test_same_documents_give_the_same_bytes_whatever_the_clock_and_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = full_iso()
    # Another instant and another time zone: nothing of either may reach the bytes.
    monkeypatch.setattr(time, "time", lambda: 1_900_000_000.37)
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        second = full_iso()
    finally:
        monkeypatch.undo()
        time.tzset()
    assert hashlib.sha256(second).hexdigest() == hashlib.sha256(first).hexdigest()
    assert second == first


def test_the_volume_uuid_is_the_fixed_date(iso_file: Path) -> None:
    # blkid derives an iso9660 UUID from the modification date: a live clock
    # there would make every build different.
    assert blkid(iso_file)["UUID"] == "2000-01-01-00-00-00-00"


def test_different_user_data_gives_different_bytes() -> None:
    other = build_nocloud_iso(
        USER_DATA + "# one more line\n", META_DATA, default_vendor_data(), NETWORK
    )
    assert hashlib.sha256(other).digest() != hashlib.sha256(full_iso()).digest()
    changed_meta = build_nocloud_iso(USER_DATA, META_DATA.replace("0123", "4567"))
    assert changed_meta != build_nocloud_iso(USER_DATA, META_DATA)


def test_size_is_whole_sectors() -> None:
    assert len(full_iso()) % 2048 == 0
