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

import hashlib
import time
from itertools import chain
from typing import Any

import libvirt
import pulumi
from pulumi.dynamic import (
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from providers.kvm.args import Change
from providers.kvm.baseinputs import BaseImageArgs, host_moved, input_failures
from providers.kvm.baselock import held, lock_volume, try_lock, wait_for_other
from providers.kvm.basevolumes import (
    Image,
    describe,
    leftover,
    read_marker,
    remove_volume,
    trusted,
    volume_facts,
    write_marker,
)
from providers.kvm.connection import LibvirtSource
from providers.kvm.download import (
    Log,
    Progress,
    content_length,
    download,
    hashed,
    initial_capacity,
    prefetched,
    shown_url,
    verify,
)
from providers.kvm.errors import HostResourceMissing, ImageError, InUseError
from providers.kvm.resource import KvmProvider
from providers.kvm.volumes import (
    backed_by,
    human,
    lookup_pool,
    lookup_volume,
    parse_volume_xml,
    require_space,
    upload,
    volume_xml,
)
from proxyinfra.stacktrace import short_stack_trace

# -- the provider ---------------------------------------------------------------------------


class BaseImageProvider(KvmProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, input_failures(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = BaseImageArgs.changed(olds, news)
        moved = "host" in changed and host_moved(olds.get("host"), news.get("host"))
        renamed = "volume" in changed or "marker" in changed
        # A new url with the same configured digest is the same content under
        # the same name: recorded in place, never a new download.
        triggers = {*BaseImageArgs.keys(Change.REPLACE), *(["url"] if renamed else [])}
        replaces = [k for k in changed if k in triggers] + (["host"] if moved else [])
        return DiffResult(
            changes=bool(changed),
            replaces=replaces,
            # Same name on the same host: the new one would be the old one's
            # volumes, which the old one's delete would then remove.
            delete_before_replace=bool(replaces) and not renamed and not moved,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        args = BaseImageArgs.from_props(props)
        access = args.host
        log = self.logger(access, args.volume)
        start = time.monotonic()
        conn = self.connection(props).libvirt()
        pool = lookup_pool(conn, access)
        image, cached = self._obtain(conn, pool, args, props, log)
        if cached:
            log.info(
                "base image cached path=%s size=%s (%d bytes) sha256=%s in %.2f s",
                image.path,
                human(image.size),
                image.size,
                image.digest,
                time.monotonic() - start,
            )
        return CreateResult(id_=args.volume, outs=outputs(args, image, cached=cached))

    def _obtain(
        self, conn: Any, pool: Any, args: BaseImageArgs, props: dict[str, Any], log: Log
    ) -> tuple[Image, bool]:
        """The base, cached (True) or fetched under the host's lock for it
        (False). Another writer holding the lock is waited for (baselock.py)."""
        lock = lock_volume(args.volume)
        while True:
            complete = self._complete(conn, pool, args)
            if complete is not None:
                return complete, True
            if try_lock(conn, pool, lock):
                break
            wait_for_other(pool, lock, lambda: self._complete(conn, pool, args) is not None, log)
        with held(conn, pool, lock, log):
            cached = self._cached(conn, pool, args, log)  # leftovers are ours to remove now
            if cached is not None:
                return cached, True
            made: list[str] = []  # what this create made, so a failure removes exactly that
            try:
                return self._fetch(conn, pool, args, log, made, self.connection(props)), False
            except BaseException as error:
                self._discard_base(props, made, error)
                raise

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        args = BaseImageArgs.from_props(props)
        conn = self.connection(props).libvirt()
        pool = lookup_pool(conn, args.host)
        base = lookup_volume(pool, args.volume)
        marker = lookup_volume(pool, args.marker) if base is not None else None
        digest = read_marker(conn, marker) if marker is not None else None
        if base is None or not trusted(digest, args.sha256):
            # Gone, or a download that never finished: the next `up` fetches it again.
            return ReadResult(id_="", outs={})
        assert digest is not None
        image = describe(base, digest)
        return ReadResult(id_=id_, outs=outputs(args, image, cached=bool(props.get("cached"))))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Only changes that keep the content reach here (a mirror url with the
        same digest, how to reach the same host): nothing on the host changes."""
        image = Image(path=olds["path"], digest=olds["digest"], size=int(olds["size"]))
        args = BaseImageArgs.from_props(news)
        return UpdateResult(outs=outputs(args, image, cached=bool(olds.get("cached"))))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        args = BaseImageArgs.from_props(props)
        access, volume, marker = args.host, args.volume, args.marker
        log = self.logger(access, volume)
        if args.keep:
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
                remove_volume(volumes[name])
        log.info("base image deleted")

    # -- create, step by step ---------------------------------------------------------------

    @staticmethod
    def _complete(conn: Any, pool: Any, args: BaseImageArgs) -> Image | None:
        """The base when it is there with a marker that vouches for it."""
        base = lookup_volume(pool, args.volume)
        marker = lookup_volume(pool, args.marker) if base is not None else None
        if base is None or marker is None:
            return None
        digest = read_marker(conn, marker)
        if not trusted(digest, args.sha256):
            return None
        assert digest is not None
        return describe(base, digest)

    def _cached(self, conn: Any, pool: Any, args: BaseImageArgs, log: Log) -> Image | None:
        """The base when it is complete and the one asked for; else removes
        whatever is left of an earlier attempt and returns None."""
        base = lookup_volume(pool, args.volume)
        marker = lookup_volume(pool, args.marker)
        if base is None and marker is None:
            return None
        digest = read_marker(conn, marker) if marker is not None else None
        expected = args.sha256
        if base is not None and trusted(digest, expected):
            assert digest is not None
            return describe(base, digest)
        log.warning("%s: removing it and fetching again", leftover(base, marker, digest, expected))
        for vol in (marker, base):  # marker first, as in delete
            if vol is not None:
                remove_volume(vol)
        return None

    def _fetch(
        self,
        conn: Any,
        pool: Any,
        args: BaseImageArgs,
        log: Log,
        made: list[str],
        source: LibvirtSource,
    ) -> Image:
        access, url, fmt, volume = args.host, args.url, args.format, args.volume
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
            with source.bulk() as bulk:  # OpenSSH's forward for the bytes (openssh.py)
                target = bulk.storageVolLookupByKey(vol.key())  # the key needs no RPC
                sent = upload(bulk, target, chain([first], prefetched(chunks)), length or 0)
        digest = hasher.hexdigest()
        verify(args.sha256, digest, sent, length, shown)
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
        self._write_marker(conn, pool, args.marker, digest, made)
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


def outputs(args: BaseImageArgs, image: Image, *, cached: bool) -> dict[str, Any]:
    return args.to_props() | {
        "path": image.path,
        "digest": image.digest,
        "size": image.size,
        "cached": cached,
    }


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
        args: BaseImageArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # No defaults here: the config's (providers/kvm/config.py) are the only ones.
        outs = {"path": None, "digest": None, "size": None, "cached": None}
        props = args.to_props() | outs
        with short_stack_trace():
            super().__init__(BaseImageProvider(), resource_name, props, opts)


__all__ = ["BaseImage", "BaseImageArgs", "BaseImageProvider", "Image", "input_failures"]
