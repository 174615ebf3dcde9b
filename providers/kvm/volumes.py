"""Storage pool helpers shared by the volume resources (traced libvirt objects)."""

from __future__ import annotations

import contextlib
import posixpath
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.capacity import pool_available
from providers.kvm.errors import CapacityError, HostResourceMissing

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class VolumeInfo:
    """What a volume's XML says about it."""

    path: str
    format: str
    capacity: int
    backing_path: str | None
    backing_format: str | None


def parse_volume_xml(xml: str) -> VolumeInfo:
    root = ET.fromstring(xml)
    backing = root.find("backingStore")
    backing_path = backing.findtext("path") if backing is not None else None
    backing_format = None
    if backing is not None and (fmt := backing.find("format")) is not None:
        backing_format = fmt.get("type")
    target_format = root.find("target/format")
    return VolumeInfo(
        path=root.findtext("target/path") or "",
        format=target_format.get("type", "") if target_format is not None else "",
        capacity=_bytes(root.find("capacity")),
        backing_path=backing_path or None,
        backing_format=backing_format,
    )


def _bytes(element: ET.Element | None) -> int:
    """A libvirt size element in bytes (libvirt writes bytes, but honours a unit)."""
    if element is None or element.text is None:
        return 0
    units = {"bytes": 1, "b": 1, "KiB": 1024, "MiB": 1024**2, "GiB": GIB}
    return int(element.text) * units.get(element.get("unit", "bytes"), 1)


def lookup_pool(conn: Any, access: HostAccess) -> Any:
    """The host's pool, or an error that names it and the host."""
    try:
        return conn.storagePoolLookupByName(access.pool)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
            raise HostResourceMissing(
                access.where,
                f"storage pool {access.pool!r} does not exist",
                "create it or fix hosts[].pool (python -m proxyinfra hosts check shows the pools)",
            ) from None
        raise


def lookup_volume(pool: Any, name: str) -> Any | None:
    """The volume, or None when the pool has none of that name."""
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def delete_volume(pool: Any, name: str) -> bool:
    """Delete by name; False when it was already gone."""
    vol = lookup_volume(pool, name)
    if vol is None:
        return False
    vol.delete(0)
    return True


def human(size: float) -> str:
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / MIB:.1f} MiB"


def require_space(pool: Any, needed: int, access: HostAccess, what: str) -> None:
    """Refuse before writing when the pool cannot hold `needed` bytes."""
    available = pool_available(pool)
    if needed > available:
        raise CapacityError(
            access.where,
            f"pool {access.pool!r} has {human(available)} available, {what} needs {human(needed)}",
            "free space in the pool or place the proxy on another host",
        )


def upload(conn: Any, vol: Any, chunks: Iterable[bytes], length: int = 0) -> int:
    """Stream chunks into a volume; nothing is buffered beyond one chunk.
    Returns the bytes sent. `length` 0 means "until the stream ends"."""
    stream = conn.newStream(0)
    vol.upload(stream, 0, length, 0)
    sent = 0
    try:
        for chunk in chunks:
            # The chunk itself, not a copy: a fresh 1 MiB buffer per send costs
            # its page faults (1.4 CPU-s per GiB, bench/kvm_baseimage_upload.py).
            while chunk:
                n = stream.send(chunk)
                if n < 0:  # -2: would block; cannot happen on a blocking stream
                    time.sleep(0.001)
                    continue
                sent += n
                chunk = chunk[n:]  # empty once all went, the usual case: no copy
        stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise
    return sent


def download_small(conn: Any, vol: Any, limit: int = 1 * MIB) -> bytes:
    """The whole content of a small volume (markers)."""
    stream = conn.newStream(0)
    vol.download(stream, 0, limit, 0)
    data = bytearray()
    while True:
        chunk = stream.recv(64 * 1024)
        if isinstance(chunk, int):
            if chunk == -2:
                continue
            break
        if not chunk:
            break
        data += chunk
    stream.finish()
    return bytes(data)


def volume_xml(name: str, capacity: int, fmt: str, backing: tuple[str, str] | None = None) -> str:
    """Volume definition; `backing` is (path, format) for an overlay."""
    from xml.sax.saxutils import escape

    parts = [
        "<volume>",
        f"<name>{escape(name)}</name>",
        f"<capacity unit='bytes'>{capacity}</capacity>",
        "<allocation unit='bytes'>0</allocation>",
        f"<target><format type='{fmt}'/></target>",
    ]
    if backing is not None:
        path, backing_format = backing
        parts.append(
            f"<backingStore><path>{escape(path)}</path><format type='{backing_format}'/></backingStore>"
        )
    parts.append("</volume>")
    return "".join(parts)


def _backing_of(vol: Any) -> str | None:
    """The normalised path of a volume's backing file (libvirt reads the qcow2
    header on the host); None without one, or when the volume vanished meanwhile."""
    try:
        info = parse_volume_xml(vol.XMLDesc(0))
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise
    backing = info.backing_path
    if not backing:
        return None
    if not backing.startswith("/"):  # relative to the overlay's directory
        backing = posixpath.join(posixpath.dirname(info.path), backing)
    return posixpath.normpath(backing)


def backed_by(volumes: dict[str, Any], path: str, skip: Iterable[str]) -> list[str]:
    """Names of the volumes whose backing file is `path`."""
    wanted = posixpath.normpath(path)
    skipped = set(skip)
    return [
        name for name, vol in volumes.items() if name not in skipped and _backing_of(vol) == wanted
    ]


def backing_paths(volumes: dict[str, Any]) -> set[str]:
    """Every backing file the volumes use: one XML read per volume, however many
    bases are checked against it."""
    return {path for vol in volumes.values() if (path := _backing_of(vol)) is not None}
