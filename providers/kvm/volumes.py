"""Storage pool helpers shared by the volume resources (traced libvirt objects)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.errors import CapacityError

GIB = 1024**3
MIB = 1024**2


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
    _state, _capacity, _allocation, available = pool.info()
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
            view = memoryview(chunk)
            while view:
                n = stream.send(view.tobytes())
                if n < 0:  # -2: would block; cannot happen on a blocking stream
                    time.sleep(0.001)
                    continue
                view = view[n:]
                sent += n
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
