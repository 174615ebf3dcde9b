"""A base image's volumes on the host: the marker ``<base>.sha256`` written
last and read back, whether an existing base can be trusted, and what a base
is as the outputs describe it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

import libvirt

from providers.kvm.volumes import download_small, parse_volume_xml, upload, volume_xml

MARKER_LIMIT = 4096  # a marker holds 64 hex digits; anything bigger is not ours
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Image:
    """A base on the host as the outputs describe it."""

    path: str
    digest: str
    size: int


def read_marker(conn: Any, marker: Any) -> str | None:
    """The digest a marker holds, or None when it holds anything else."""
    text = download_small(conn, marker, MARKER_LIMIT).decode("ascii", "replace").strip()
    return text if SHA256_HEX.fullmatch(text) else None


def write_marker(conn: Any, pool: Any, name: str, digest: str, made: list[str]) -> None:
    data = digest.encode("ascii")
    vol = pool.createXML(volume_xml(name, len(data), "raw"), 0)
    made.append(name)
    upload(conn, vol, [data], len(data))


def trusted(digest: str | None, expected: str | None) -> bool:
    return digest is not None and (not expected or digest == expected)


def leftover(base: Any, marker: Any, digest: str | None, expected: str | None) -> str:
    """Why an existing base or marker cannot be used."""
    if base is None:
        return "a marker without its base volume (an interrupted delete)"
    if marker is None:
        return "a base volume without marker (an interrupted download)"
    if digest is None:
        return "a marker that holds no sha256"
    return f"the marker says sha256 {digest}, the configured sha256 is {expected}"


def describe(vol: Any, digest: str) -> Image:
    """A base as the outputs describe it, from one XMLDesc."""
    path, physical, capacity = volume_facts(vol)
    # Without <physical> (libvirt before 3.0) the capacity is the nearest
    # figure: right for raw, the virtual size for qcow2.
    return Image(path=path, digest=digest, size=physical if physical is not None else capacity)


def volume_facts(vol: Any) -> tuple[str, int | None, int]:
    """Path, file size (<physical>, None when libvirt does not say) and
    capacity. libvirt re-reads the file to answer, so these are current."""
    xml = vol.XMLDesc(0)
    info = parse_volume_xml(xml)
    element = ET.fromstring(xml).find("physical")
    text = (element.text or "").strip() if element is not None else ""
    return info.path, int(text) if text.isdigit() else None, info.capacity


def remove_volume(vol: Any) -> None:
    """Delete, tolerating that someone else just did."""
    try:
        vol.delete(0)
    except libvirt.libvirtError as error:
        if error.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
            raise
