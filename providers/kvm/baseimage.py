"""BaseImage: a VM image fetched once per host into its libvirt pool.

The image is streamed from its http(s) URL through the provider straight into
a pool volume by libvirt volume upload, hashed on the way; nothing is
buffered beyond one chunk, so memory stays flat whatever the image's size.
A marker volume ``<base>.sha256`` holding the hex digest is written last, so
a base without a marker is a download that never finished.

Base volumes are named by content (proxyinfra.names.base_volume): a changed
url or sha256 lands beside the old base, whose overlays keep their backing
file until they are replaced. With ``keep`` (the config's default), delete
leaves base and marker in the pool as a cache for the next create; without,
the base is deleted only once no volume in the pool backs onto it, which
delete checks on the host.

Create uses the cached copy when base and marker exist and the marker agrees
with a configured sha256, so an image given by a "latest" URL is pinned at
its first fetch on each host. A failed create removes what it made.

Inputs: ``host`` (HostAccess.to_props()), ``url``, ``sha256`` (optional),
``format`` (qcow2 or raw), ``keep`` (bool), ``volume`` and ``marker`` (the
names). Outputs:
the inputs plus ``path``, ``digest`` (sha256 of the bytes), ``size`` (bytes
of the file) and ``cached`` (whether create found it already there).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import struct
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import httpx
import libvirt
import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from providers.kvm.access import HostAccess
from providers.kvm.errors import HostResourceMissing, ImageError, InUseError
from providers.kvm.resource import KvmProvider
from providers.kvm.volumes import (
    MIB,
    backed_by,
    download_small,
    human,
    lookup_pool,
    lookup_volume,
    parse_volume_xml,
    require_space,
    upload,
    volume_xml,
)
from proxyinfra.names import base_marker_volume, base_volume

Log = logging.LoggerAdapter[logging.Logger]

FORMATS = ("qcow2", "raw")
INPUTS = ("host", "url", "sha256", "format", "volume", "marker", "keep")
# Where a base lives; the other host fields only say how to get there.
HOST_IDENTITY = ("address", "port", "socket", "pool")
CHUNK = MIB  # per HTTP read and per libvirt stream send: memory is a few of these
PROGRESS_SECONDS = 2.0
PROGRESS_PERCENT = 10
MARKER_LIMIT = 4096  # a marker holds 64 hex digits; anything bigger is not ours
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
QCOW2_MAGIC = b"QFI\xfb"
QCOW2_HEADER = 32  # magic, version, backing file offset and size, cluster bits, virtual size
# Generous read timeout: a mirror may pause, but a dead one must not hang `pulumi up`.
TIMEOUT = httpx.Timeout(60.0, connect=30.0)


@dataclass(frozen=True)
class Image:
    """A base on the host as the outputs describe it."""

    path: str
    digest: str
    size: int


# -- the provider ---------------------------------------------------------------------------


class BaseImageProvider(KvmProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, input_failures(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in INPUTS if _differs(k, olds.get(k), news.get(k))]
        moved = "host" in changed and _host_moved(olds.get("host"), news.get("host"))
        renamed = "volume" in changed or "marker" in changed
        # A new url with the same configured digest is the same content under
        # the same name: recorded in place, never a new download.
        triggers = {"volume", "marker", "sha256", "format"} | ({"url"} if renamed else set())
        replaces = [k for k in changed if k in triggers] + (["host"] if moved else [])
        return DiffResult(
            changes=bool(changed),
            replaces=replaces,
            # Same name on the same host: the new one would be the old one's
            # volumes, which the old one's delete would then remove.
            delete_before_replace=bool(replaces) and not renamed and not moved,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        access = self.access(props)
        log = self.logger(access, props["volume"])
        start = time.monotonic()
        conn = self.connection(props).libvirt()
        pool = lookup_pool(conn, access)
        cached = self._cached(conn, pool, props, log)
        if cached is not None:
            log.info(
                "base image cached path=%s size=%s (%d bytes) sha256=%s in %.2f s",
                cached.path,
                human(cached.size),
                cached.size,
                cached.digest,
                time.monotonic() - start,
            )
            return CreateResult(id_=props["volume"], outs=outputs(props, cached, cached=True))
        made: list[str] = []  # what this create made, so a failure removes exactly that
        try:
            image = self._fetch(conn, pool, access, props, log, made)
        except BaseException as error:
            self._discard_base(props, made, error)
            raise
        return CreateResult(id_=props["volume"], outs=outputs(props, image, cached=False))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        access = self.access(props)
        conn = self.connection(props).libvirt()
        pool = lookup_pool(conn, access)
        base = lookup_volume(pool, props["volume"])
        marker = lookup_volume(pool, props["marker"]) if base is not None else None
        digest = read_marker(conn, marker) if marker is not None else None
        if base is None or not _trusted(digest, props.get("sha256")):
            # Gone, or a download that never finished: the next `up` fetches it again.
            return ReadResult(id_="", outs={})
        assert digest is not None
        image = describe(base, digest)
        return ReadResult(id_=id_, outs=outputs(props, image, cached=bool(props.get("cached"))))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Only changes that keep the content reach here (a mirror url with the
        same digest, how to reach the same host): nothing on the host changes."""
        image = Image(path=olds["path"], digest=olds["digest"], size=int(olds["size"]))
        return UpdateResult(outs=outputs(news, image, cached=bool(olds.get("cached"))))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        access = self.access(props)
        volume, marker = props["volume"], props["marker"]
        log = self.logger(access, volume)
        if props.get("keep") is True:
            # The cache outlives the stack: the next create of this content on
            # this host (any stack) skips the download.
            log.info(
                "base image kept in pool %r as a cache (keepOnDestroy); nothing deleted",
                access.pool,
            )
            return
        conn = self.connection(props).libvirt()
        try:
            pool = lookup_pool(conn, access)
        except HostResourceMissing:
            log.warning("pool %r is gone, and the base image with it", access.pool)
            return
        volumes = {v.name(): v for v in pool.listAllVolumes(0)}
        base = volumes.get(volume)
        if base is not None:
            path = parse_volume_xml(base.XMLDesc(0)).path
            users = backed_by(volumes, path, skip={volume, marker})
            if users:
                raise InUseError(
                    f"{access.where}: base image {volume} ({path}) in pool {access.pool!r} is "
                    f"still the backing file of {', '.join(sorted(users))}; replace or delete "
                    "those volumes first (`pulumi up` moves overlays onto the new base), "
                    "then run again"
                )
        # Marker first: a delete cut short leaves a base without marker,
        # which the next create recognises as broken and fetches again.
        for name in (marker, volume):
            if name in volumes:
                _delete(volumes[name])
        log.info("base image deleted")

    # -- create, step by step ---------------------------------------------------------------

    def _cached(self, conn: Any, pool: Any, props: dict[str, Any], log: Log) -> Image | None:
        """The base when it is complete and the one asked for; else removes
        whatever is left of an earlier attempt and returns None."""
        base = lookup_volume(pool, props["volume"])
        marker = lookup_volume(pool, props["marker"])
        if base is None and marker is None:
            return None
        digest = read_marker(conn, marker) if marker is not None else None
        expected = props.get("sha256") or None
        if base is not None and _trusted(digest, expected):
            assert digest is not None
            return describe(base, digest)
        log.warning("%s: removing it and fetching again", _leftover(base, marker, digest, expected))
        for vol in (marker, base):  # marker first, as in delete
            if vol is not None:
                _delete(vol)
        return None

    def _fetch(
        self,
        conn: Any,
        pool: Any,
        access: HostAccess,
        props: dict[str, Any],
        log: Log,
        made: list[str],
    ) -> Image:
        url, fmt, volume = props["url"], props["format"], props["volume"]
        shown = shown_url(url)
        with download(url) as response:
            length = content_length(response)
            log.info(
                "fetching base image into host pool url=%s pool=%s volume=%s size=%s",
                shown,
                access.pool,
                volume,
                f"{human(length)} ({length} bytes)" if length is not None else "unknown",
            )
            progress = Progress(log, length)
            hasher = hashlib.sha256()
            chunks = hashed(response, hasher, progress, shown)
            first = next(chunks, b"")
            # Checked before anything lands on the host: a wrong file, no room.
            capacity = initial_capacity(fmt, first, length, shown)
            if length is not None:
                require_space(pool, length, access, f"base image {volume}")
            vol = pool.createXML(volume_xml(volume, capacity, fmt), 0)
            made.append(volume)
            sent = upload(conn, vol, chain([first], chunks), length or 0)
        digest = hasher.hexdigest()
        verify(props.get("sha256") or None, digest, sent, length, shown)
        path, physical, _capacity = volume_facts(vol)
        # An upload overwrites the file libvirt made but never truncates it:
        # a qcow2 smaller than the header qemu-img wrote would keep its tail.
        if physical is not None and physical != sent:
            raise ImageError(
                f"{shown}: the volume file is {physical} bytes after uploading {sent}: "
                f"libvirt pre-writes a {fmt} file of {physical} bytes that this smaller "
                "image does not cover, so the copy would not be exact; serve it as raw or "
                "in a larger qcow2"
            )
        image = Image(path=path, digest=digest, size=sent)
        self._write_marker(conn, pool, props["marker"], digest, made)
        log.info(
            "base image fetched into host pool path=%s size=%s (%d bytes) in %.1f s "
            "(%.1f MiB/s) sha256=%s",
            image.path,
            human(image.size),
            image.size,
            progress.elapsed,
            progress.rate,
            digest,
        )
        return image

    @staticmethod
    def _write_marker(conn: Any, pool: Any, name: str, digest: str, made: list[str]) -> None:
        """The last step of a fetch (a method so a test can make it fail)."""
        write_marker(conn, pool, name, digest, made)

    def _discard_base(self, props: dict[str, Any], made: list[str], error: BaseException) -> None:
        """Name the image in a libvirt error, then remove what this create made."""
        access = self.access(props)
        if isinstance(error, libvirt.libvirtError):
            error.add_note(f"{access.where}: base image {props['volume']} in pool {access.pool!r}")
        self._discard(props, error, made)


# -- inputs -------------------------------------------------------------------------------


def input_failures(news: dict[str, Any]) -> list[CheckFailure]:
    unknown = {k for k, v in news.items() if _is_unknown(v)}  # preview: not known yet
    props = {k: v for k, v in news.items() if k not in unknown}
    failures = []
    url, sha256, fmt = props.get("url"), props.get("sha256") or None, props.get("format")
    if "url" not in unknown and not _http_url(url):
        failures.append(
            CheckFailure("url", f"must be an http or https URL with a host, got {shown_url(url)!r}")
        )
    if sha256 is not None and not (isinstance(sha256, str) and SHA256_HEX.fullmatch(sha256)):
        failures.append(
            CheckFailure("sha256", f"must be 64 lowercase hex digits (a sha256), got {sha256!r}")
        )
    if "format" not in unknown and fmt not in FORMATS:
        failures.append(CheckFailure("format", f"must be one of {FORMATS}, got {fmt!r}"))
    if "keep" not in unknown and not isinstance(props.get("keep", False), bool):
        failures.append(CheckFailure("keep", f"must be true or false, got {props['keep']!r}"))
    if "host" not in unknown:
        failures += _host_failures(props.get("host"))
    if failures or unknown & {"url", "sha256", "format", "volume", "marker"}:
        return failures
    assert isinstance(url, str) and isinstance(fmt, str)  # checked above
    volume = base_volume(url, sha256, fmt)
    for key, wanted in (("volume", volume), ("marker", base_marker_volume(volume))):
        if props.get(key) != wanted:
            failures.append(
                CheckFailure(
                    key,
                    f"must be {wanted!r} (named by content from url, sha256 and format, "
                    f"see proxyinfra.names), got {props.get(key)!r}",
                )
            )
    return failures


def _host_failures(host: Any) -> list[CheckFailure]:
    try:
        access = HostAccess.from_props(host)
    except (TypeError, ValueError, AttributeError) as error:
        return [CheckFailure("host", f"not a host's access settings: {error}")]
    missing = [
        k for k in ("address", "user", "key_file", "socket", "pool") if not getattr(access, k)
    ]
    if missing:
        return [CheckFailure("host", f"missing {', '.join(missing)}")]
    return []


def _http_url(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


def shown_url(url: Any) -> str:
    """The URL for logs and errors, without a password it may carry."""
    return re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", url) if isinstance(url, str) else repr(url)


def _is_unknown(value: Any) -> bool:
    return isinstance(value, pulumi.output.Unknown)


def _access(value: Any) -> HostAccess | None:
    try:
        return HostAccess.from_props(value)
    except (TypeError, ValueError, AttributeError):
        return None


def _differs(key: str, old: Any, new: Any) -> bool:
    if _is_unknown(new):
        return True
    if key == "host":  # numbers come back from state as floats
        return _access(old) is None or _access(old) != _access(new)
    if key == "sha256":
        return (old or None) != (new or None)
    return bool(old != new)


def _host_moved(old: Any, new: Any) -> bool:
    before, after = _access(old), _access(new)
    if before is None or after is None:
        return True
    return any(getattr(before, k) != getattr(after, k) for k in HOST_IDENTITY)


def outputs(props: dict[str, Any], image: Image, *, cached: bool) -> dict[str, Any]:
    outs = {k: props.get(k) for k in INPUTS}
    outs.update(path=image.path, digest=image.digest, size=image.size, cached=cached)
    return outs


# -- the download ---------------------------------------------------------------------------


@contextlib.contextmanager
def download(url: str) -> Iterator[httpx.Response]:
    """The response, headers read and status checked, body not yet."""
    shown = shown_url(url)
    # identity: the digest is of the file as published, not of a re-encoding.
    headers = {"Accept-Encoding": "identity"}
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True, headers=headers) as client:
        try:
            response = client.send(client.build_request("GET", url), stream=True)
        except httpx.HTTPError as error:
            raise ImageError(f"could not fetch {shown}: {_reason(error)}") from None
        try:
            if response.status_code != httpx.codes.OK:
                raise ImageError(
                    f"could not fetch {shown}: HTTP {response.status_code} {response.reason_phrase}"
                )
            yield response
        finally:
            response.close()


def content_length(response: httpx.Response) -> int | None:
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def hashed(
    response: httpx.Response, hasher: Any, progress: Progress, shown: str
) -> Iterator[bytes]:
    """The body in chunks, hashed and counted on the way; a broken transfer
    becomes an ImageError saying how far it got."""
    try:
        for chunk in response.iter_raw(CHUNK):
            hasher.update(chunk)
            progress.add(len(chunk))
            yield chunk
    except httpx.HTTPError as error:
        raise ImageError(
            f"download of {shown} broke off after {progress.done} bytes: {_reason(error)}"
        ) from None


def _reason(error: httpx.HTTPError) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def initial_capacity(fmt: str, first: bytes, length: int | None, shown: str) -> int:
    """The capacity to create the volume with. For raw that is the file's size.
    For qcow2 libvirt writes a fresh header of that virtual size (qemu-img
    create) which the upload then overwrites with the image's own; taking the
    image's virtual size from its header keeps libvirt's view right meanwhile."""
    if fmt == "raw":
        return length or 0
    if len(first) < QCOW2_HEADER or not first.startswith(QCOW2_MAGIC):
        raise ImageError(
            f"{shown} is not a qcow2 image (it starts with {first[:16]!r}); "
            "check the url, or set format to what the file is"
        )
    (virtual_size,) = struct.unpack_from(">Q", first, 24)
    return int(virtual_size)


def verify(expected: str | None, digest: str, sent: int, length: int | None, shown: str) -> None:
    if length is not None and sent != length:
        raise ImageError(f"download of {shown} gave {sent} bytes, Content-Length said {length}")
    if expected is not None and digest != expected:
        raise ImageError(
            f"{shown}: sha256 mismatch: expected {expected}, got {digest} ({sent} bytes); "
            "nothing was kept on the host"
        )


class Progress:
    """Info lines during a long download, never per chunk: at most one every
    PROGRESS_SECONDS, and with a known size only after another
    PROGRESS_PERCENT, so a slow multi-GiB download logs about ten lines."""

    def __init__(self, log: Log, total: int | None) -> None:
        self.log = log
        self.total = total or None
        self.done = 0
        self.start = self._last = time.monotonic()
        self._step = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def rate(self) -> float:
        """MiB/s so far."""
        return self.done / MIB / max(self.elapsed, 1e-6)

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last < PROGRESS_SECONDS or self.done == self.total:
            return  # too soon, or finished: the final line says it
        if self.total is None:
            self._last = now
            self.log.info("fetching base image: %s at %.1f MiB/s", human(self.done), self.rate)
            return
        percent = self.done * 100 // self.total
        if percent // PROGRESS_PERCENT <= self._step:
            return
        self._last, self._step = now, percent // PROGRESS_PERCENT
        self.log.info(
            "fetching base image: %s of %s (%d%%) at %.1f MiB/s",
            human(self.done),
            human(self.total),
            percent,
            self.rate,
        )


# -- volumes ------------------------------------------------------------------------------


def read_marker(conn: Any, marker: Any) -> str | None:
    """The digest a marker holds, or None when it holds anything else."""
    text = download_small(conn, marker, MARKER_LIMIT).decode("ascii", "replace").strip()
    return text if SHA256_HEX.fullmatch(text) else None


def write_marker(conn: Any, pool: Any, name: str, digest: str, made: list[str]) -> None:
    data = digest.encode("ascii")
    vol = pool.createXML(volume_xml(name, len(data), "raw"), 0)
    made.append(name)
    upload(conn, vol, [data], len(data))


def _trusted(digest: str | None, expected: str | None) -> bool:
    return digest is not None and (not expected or digest == expected)


def _leftover(base: Any, marker: Any, digest: str | None, expected: str | None) -> str:
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


def _delete(vol: Any) -> None:
    """Delete, tolerating that someone else just did."""
    try:
        vol.delete(0)
    except libvirt.libvirtError as error:
        if error.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
            raise


# -- the resource -----------------------------------------------------------------------------


class BaseImage(pulumi.dynamic.Resource):
    """One image on one host. Inputs ``host``, ``url``, ``sha256``, ``format``,
    ``keep`` (delete leaves the volumes as a cache) and the content-derived
    ``volume`` and ``marker``; outputs those plus
    ``path``, ``digest``, ``size`` (bytes) and ``cached``."""

    volume: pulumi.Output[str]
    marker: pulumi.Output[str]
    path: pulumi.Output[str]
    digest: pulumi.Output[str]
    size: pulumi.Output[float]
    cached: pulumi.Output[bool]

    def __init__(
        self,
        resource_name: str,
        *,
        host: HostAccess,
        url: str,
        sha256: str | None,
        format: str,
        keep: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # No defaults here: the config's (providers/kvm/config.py) are the only ones.
        volume = base_volume(url, sha256, format)
        props = {
            "host": host.to_props(),
            "url": url,
            "sha256": sha256,
            "format": format,
            "volume": volume,
            "marker": base_marker_volume(volume),
            "keep": keep,
            "path": None,
            "digest": None,
            "size": None,
            "cached": None,
        }
        super().__init__(BaseImageProvider(), resource_name, props, opts)


__all__ = ["BaseImage", "BaseImageProvider", "Image", "input_failures"]
