"""Faults a fast test puts into a simulated host, outside the product.

The product's simulated host (providers.kvm.simulated) has no test hooks: a
:class:`FaultyHost` layers its faults on the connection the host hands out,
delegating everything else, so the kvm resources meet them exactly where a
real host would fail:

- ``fail_upload_after = N``: an upload breaks off (a libvirt error from the
  stream) once it would pass N bytes;
- ``prewrite_qcow2 = N``: a new qcow2 volume starts as a file of N bytes, as
  qemu-img create writes one, which an upload overwrites but, as libvirt's,
  never truncates (``prewritten`` holds their paths);
- ``answer_from``: the address sources (``VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_*``)
  the guest answers through, the others answer nothing (None: every one;
  empty: the guest never reports an address).

``uploads`` lists the volumes whose uploads finished, in order.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt

from providers.kvm.simulated import SimulatedHost


class FaultyHost(SimulatedHost):
    def __init__(self, directory: Path, *, pool: str, network: str | None) -> None:
        super().__init__(directory, pool=pool, network=network)
        self.fail_upload_after: int | None = None
        self.prewrite_qcow2 = 0
        self.prewritten: set[str] = set()
        self.answer_from: set[int] | None = None
        self.uploads: list[str] = []

    def libvirt(self) -> Any:
        return _Layer(super().libvirt(), self)


class _Layer:
    """Delegates to the simulated host's object, layering what its calls
    return; a subclass overrides the calls a fault changes."""

    def __init__(self, inner: Any, host: FaultyHost) -> None:
        self.inner = inner
        self.host = host

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: _layer(attr(*args, **kwargs), self.host)

    def newStream(self, flags: int = 0) -> _Stream:
        return _Stream(self.inner.newStream(flags), self.host)


def _layer(value: Any, host: FaultyHost) -> Any:
    if isinstance(value, list):
        return [_layer(v, host) for v in value]
    raw = getattr(value, "raw", None)  # the libvirt object the product wraps
    if isinstance(raw, libvirt.virStoragePool):
        return _Pool(value, host)
    if isinstance(raw, libvirt.virStorageVol):
        return _Vol(value, host)
    if isinstance(raw, libvirt.virDomain):
        return _Domain(value, host)
    return value


class _Pool(_Layer):
    def createXML(self, xml: str, flags: int = 0) -> _Vol:
        vol = self.inner.createXML(xml, flags)
        fmt = ET.fromstring(xml).find("target/format")
        if self.host.prewrite_qcow2 and fmt is not None and fmt.get("type") == "qcow2":
            path = vol.raw.path()
            self.host.contents[path] = bytes(self.host.prewrite_qcow2)
            self.host.prewritten.add(path)
        return _Vol(vol, self.host)


class _Vol(_Layer):
    def upload(self, stream: _Stream, offset: int, length: int, flags: int) -> int:
        stream.path = self.inner.raw.path()
        result: int = self.inner.upload(stream.inner, offset, length, flags)
        return result

    def download(self, stream: _Stream, offset: int, length: int, flags: int) -> int:
        result: int = self.inner.download(stream.inner, offset, length, flags)
        return result


class _Domain(_Layer):
    def interfaceAddresses(self, source: int, flags: int = 0) -> Any:
        answers = self.host.answer_from
        return (
            self.inner.interfaceAddresses(source, flags)
            if answers is None or source in answers
            else {}
        )


class _Stream:
    def __init__(self, inner: Any, host: FaultyHost) -> None:
        self.inner = inner
        self.host = host
        self.path: str | None = None  # the volume an upload goes to
        self.sent = 0

    def send(self, data: bytes) -> int:
        limit = self.host.fail_upload_after
        if limit is not None and self.sent + len(data) > limit:
            raise libvirt.libvirtError("test host: the upload broke off")
        self.sent += len(data)
        n: int = self.inner.send(data)
        return n

    def recv(self, size: int) -> bytes:
        chunk: bytes = self.inner.recv(size)
        return chunk

    def abort(self) -> None:
        self.inner.abort()

    def finish(self) -> None:
        path, host = self.path, self.host
        before = host.contents.get(path, b"") if path else b""
        self.inner.finish()
        if path is None:
            return  # a download
        name = path.rsplit("/", 1)[-1]
        received = host.contents[path]
        if path in host.prewritten:  # overwritten, not truncated: the file keeps its tail
            host.contents[path] = received + before[len(received) :]
            host.save_contents(name, path)
        host.uploads.append(name)
