"""The NoCloud seed ISO, built in memory and byte-for-byte reproducible.

cloud-init's NoCloud datasource finds its seed with blkid: a filesystem of
``TYPE=iso9660`` whose ``LABEL`` is ``cidata`` (or ``CIDATA``). blkid takes the
label from the Joliet volume descriptor when one exists and differs from the
primary one, so both carry ``cidata`` (pycdlib writes the same identifier to
both). cloud-init then mounts it and reads ``user-data`` and ``meta-data``
(required), ``vendor-data`` and ``network-config`` (optional) by those exact
names: plain ISO 9660 names are upper case without dashes, so the files also
get Rock Ridge names (what Linux's isofs shows by default) and Joliet names
(for readers without Rock Ridge), like ``genisoimage -joliet -rock``.

Reproducibility: pycdlib stamps the current local time into every directory
record, Rock Ridge TF entry and volume descriptor, and stamps the volume
modification date again while writing. Those dates are pinned to one fixed
UTC instant (:data:`FIXED_DATE`), so the same documents always give the same
bytes (and the same sha256), whatever the clock or the time zone.

Nothing here logs, and no error message quotes a document: they hold secrets.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pycdlib
from pycdlib.dates import DirectoryRecordDate, VolumeDescriptorDate

LABEL: Final = "cidata"
SECTOR: Final = 2048
# 2000-01-01T00:00:00Z: any constant works; this one reads as "not a real date"
# and is also what blkid turns into the volume's UUID (2000-01-01-00-00-00-00).
FIXED_DATE: Final = (2000, 1, 1, 0, 0, 0)
# Root-only inside the guest: cloud-init (root) is the only reader of secrets.
FILE_MODE: Final = 0o100400
APPLICATION: Final = "egress-proxies"

# ECMA-119 8.4: volume descriptors start at sector 16; in each primary (1) or
# supplementary (2) one, the creation, modification and effective dates are
# 17-byte fields at these offsets (the expiration date, at 847, stays "unset").
_FIRST_VD_SECTOR: Final = 16
_VD_TERMINATOR: Final = 255
_VD_DATED_TYPES: Final = (1, 2)
_VD_DATE_OFFSETS: Final = (813, 830, 864)


@dataclass(frozen=True)
class SeedFile:
    name: str  # the NoCloud name, e.g. "user-data"
    data: bytes


def nocloud_files(
    user_data: str,
    meta_data: str,
    vendor_data: str | None = None,
    network_config: str | None = None,
) -> list[SeedFile]:
    """The files of a NoCloud seed; optional documents are left out when None."""
    files = [
        SeedFile("user-data", user_data.encode()),
        SeedFile("meta-data", meta_data.encode()),
    ]
    if vendor_data is not None:
        files.append(SeedFile("vendor-data", vendor_data.encode()))
    if network_config is not None:
        files.append(SeedFile("network-config", network_config.encode()))
    return files


def build_iso(files: list[SeedFile], label: str = LABEL) -> bytes:
    """An ISO 9660 image (Joliet + Rock Ridge) holding `files` at its root."""
    iso = pycdlib.PyCdlib()
    iso.new(
        interchange_level=3,  # 30-character names: no 8.3 truncation in the plain names
        vol_ident=label,
        app_ident_str=APPLICATION,
        joliet=3,
        rock_ridge="1.09",  # what genisoimage -rock writes; the most widely read
    )
    for seed_file in sorted(files, key=lambda f: f.name):
        iso.add_fp(
            io.BytesIO(seed_file.data),
            len(seed_file.data),
            iso_path=f"/{_iso9660_name(seed_file.name)};1",
            rr_name=seed_file.name,
            joliet_path=f"/{seed_file.name}",
            file_mode=FILE_MODE,
        )
    _pin_object_dates(iso)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    image = bytearray(out.getvalue())
    _pin_descriptor_dates(image)
    return bytes(image)


def build_nocloud_iso(
    user_data: str,
    meta_data: str,
    vendor_data: str | None = None,
    network_config: str | None = None,
) -> bytes:
    return build_iso(nocloud_files(user_data, meta_data, vendor_data, network_config))


def read_nocloud_file(image: bytes, name: str) -> bytes:
    """The file NAME (``user-data``) of a seed built here, by its Joliet name."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    try:
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, joliet_path=f"/{name}")
        return out.getvalue()
    finally:
        iso.close()


def _iso9660_name(name: str) -> str:
    """``user-data`` -> ``USER_DATA.``: d-characters only, an empty extension."""
    plain = "".join(c if c.isalnum() else "_" for c in name.upper())
    return f"{plain}."


def _pin_object_dates(iso: pycdlib.PyCdlib) -> None:
    """Every date object reachable from the ISO set to FIXED_DATE (UTC).

    pycdlib offers no option for this; walking its objects generically, rather
    than naming the attributes that hold dates, keeps working when a version
    moves them around (directory records, Rock Ridge TF entries, descriptors)."""
    year, month, day, hour, minute, second = FIXED_DATE
    vd_text = f"{year:04}{month:02}{day:02}{hour:02}{minute:02}{second:02}00".encode() + b"\x00"
    for obj in _pycdlib_objects(iso):
        if isinstance(obj, DirectoryRecordDate) and getattr(obj, "_initialized", False):
            obj.years_since_1900, obj.month, obj.day_of_month = year - 1900, month, day
            obj.hour, obj.minute, obj.second, obj.gmtoffset = hour, minute, second, 0
        elif isinstance(obj, VolumeDescriptorDate) and getattr(obj, "_initialized", False):
            if obj.date_str == VolumeDescriptorDate.EMPTY_STRING:
                continue  # "not specified" (the expiration date): must stay so
            obj.year, obj.month, obj.dayofmonth = year, month, day
            obj.hour, obj.minute, obj.second = hour, minute, second
            obj.hundredthsofsecond, obj.gmtoffset, obj.date_str = 0, 0, vd_text


def _pycdlib_objects(root: object) -> Iterator[object]:
    """Objects of pycdlib's own classes reachable from `root` (each once)."""
    seen: set[int] = set()
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
            continue
        if not type(obj).__module__.startswith("pycdlib"):
            continue  # file objects, bytes, numbers: nothing dated inside
        yield obj
        stack.extend(_attribute_values(obj))


def _attribute_values(obj: object) -> list[object]:
    names: set[str] = set(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    return [getattr(obj, name) for name in names if hasattr(obj, name)]


def _pin_descriptor_dates(image: bytearray) -> None:
    """Volume descriptor dates, in the written bytes: pycdlib stamps the
    modification date with the clock inside record(), after any object fix."""
    year, month, day, hour, minute, second = FIXED_DATE
    stamp = f"{year:04}{month:02}{day:02}{hour:02}{minute:02}{second:02}00".encode() + b"\x00"
    sector = _FIRST_VD_SECTOR
    while (sector + 1) * SECTOR <= len(image):
        start = sector * SECTOR
        kind = image[start]
        if kind == _VD_TERMINATOR:
            return
        if kind in _VD_DATED_TYPES:
            for offset in _VD_DATE_OFFSETS:
                image[start + offset : start + offset + len(stamp)] = stamp
        sector += 1
    raise ValueError("ISO image has no volume descriptor set terminator")
