"""Overlay: a proxy's disk, a thin qcow2 backed by the host's base image.

The overlay is made by libvirt (qemu-img on the host) with the base as its
backing file and the base's format recorded in the header, so qemu never
probes the format of the base. Its virtual size is ``sizeGb`` GiB; it can
never be smaller than the base's virtual size, which create checks first.

Names are fixed (one overlay per proxy id), so every replacement deletes
first. A larger ``sizeGb`` grows the volume in place; a smaller one replaces
it (qcow2 images are not shrunk: the guest's filesystem would be cut). A
volume grown beyond ``sizeGb`` out of band is left as it is.

An overlay that already exists when create runs (a create killed half way,
or state that was lost) holds a VM's data: it is adopted when it is a qcow2
backed by the same base in the same format, else create fails naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic

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
from providers.kvm.args import Change, Made, ResourceArgs, arg, is_unknown
from providers.kvm.capacity import size_bytes
from providers.kvm.errors import HostError, HostResourceMissing
from providers.kvm.resource import VolumeProvider
from providers.kvm.volumes import (
    GIB,
    VolumeInfo,
    human,
    lookup_pool,
    lookup_volume,
    parse_volume_xml,
    require_space,
    volume_xml,
)
from proxyinfra.rollout import gated
from proxyinfra.stacktrace import short_stack_trace

FORMATS = ("qcow2", "raw")
MAX_SIZE_GB = 65536  # the config's own bound on diskSizeGb


@dataclass(frozen=True)
class OverlayArgs(ResourceArgs, Generic[Made]):
    """Overlay's inputs. The name is fixed, so a replacement deletes first."""

    host: HostAccess = arg("host", Change.REPLACE, HostAccess)
    name: str = arg("name", Change.REPLACE, str)
    base_path: Made = arg("basePath", Change.REPLACE, str)
    base_format: str = arg("baseFormat", Change.REPLACE, str)
    # Grows in place; a smaller size replaces (see diff).
    size_gb: int = arg("sizeGb", Change.UPDATE, int)


def _args(props: dict[str, Any]) -> OverlayArgs[str]:
    return OverlayArgs.from_props(props)


class OverlayProvider(VolumeProvider):
    kind = "overlay"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        known = {k: v for k, v in news.items() if not is_unknown(v)}  # preview: base not made yet
        if "name" in known and (not isinstance(known["name"], str) or not known["name"]):
            failures.append(CheckFailure("name", "the volume name must be a non-empty string"))
        base = known.get("basePath")
        if "basePath" in known and (not isinstance(base, str) or not base.startswith("/")):
            failures.append(CheckFailure("basePath", f"must be an absolute path, got {base!r}"))
        fmt = known.get("baseFormat")
        if "baseFormat" in known and fmt not in FORMATS:
            failures.append(CheckFailure("baseFormat", f"must be one of {FORMATS}, got {fmt!r}"))
        size = known.get("sizeGb")
        if "sizeGb" in known and not _whole_gb(size):
            failures.append(
                CheckFailure(
                    "sizeGb", f"must be a whole number from 1 to {MAX_SIZE_GB}, got {size!r}"
                )
            )
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = OverlayArgs.changed(olds, news, Change.REPLACE)
        resized, shrinks = _size_change(olds, news.get("sizeGb"))
        if shrinks:
            replaces.append("sizeGb")
        return DiffResult(
            changes=bool(replaces) or resized,
            replaces=replaces,
            delete_before_replace=True,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        args = _args(props)
        access, name = args.host, args.name
        log = self.logger(access, name)
        conn = self.connection(props).libvirt()
        pool = lookup_pool(conn, access)
        capacity = size_bytes(args.size_gb)
        existing = lookup_volume(pool, name)
        if existing is not None:
            info = self._adopt(existing, args, capacity)
            log.warning(
                "adopted existing overlay %s (backed by %s, %s)",
                info.path,
                info.backing_path,
                human(info.capacity),
            )
            return CreateResult(id_=name, outs=self._outputs(props, info))
        self._check_base(conn, args, capacity)
        # Thin, but it grows to its virtual size: a pool that cannot hold that
        # much once is too small for it (many overlays may still overcommit).
        require_space(pool, capacity, access, f"overlay {name!r} ({human(capacity)} virtual)")
        vol = pool.createXML(
            volume_xml(name, capacity, "qcow2", (args.base_path, args.base_format)), 0
        )
        try:
            info = self._describe(vol)
        except BaseException as error:
            self._discard(props, error)
            raise
        log.info(
            "overlay created %s backed by %s (%s), %s virtual",
            info.path,
            info.backing_path,
            info.backing_format,
            human(info.capacity),
        )
        return CreateResult(id_=name, outs=self._outputs(props, info))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        args = _args(props)
        conn = self.connection(props).libvirt()
        vol = lookup_volume(lookup_pool(conn, args.host), args.name)
        if vol is None:
            return ReadResult(id_="", outs={})
        return ReadResult(id_=id_, outs=self._outputs(props, self._describe(vol)))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Only growth reaches here (diff replaces on everything else)."""
        args = _args(news)
        access, name = args.host, args.name
        conn = self.connection(news).libvirt()
        vol = lookup_volume(lookup_pool(conn, access), name)
        if vol is None:
            raise HostError(
                access.where,
                f"overlay {name!r} is missing from pool {access.pool!r}",
                "run `pulumi refresh` so it is created again",
            )
        capacity = size_bytes(args.size_gb)
        info = self._describe(vol)
        if capacity > info.capacity:  # never shrink: libvirt refuses, and data would be cut
            vol.resize(capacity, 0)
            info = self._describe(vol)
            self.logger(access, name).info("overlay grown to %s", human(info.capacity))
        return UpdateResult(outs=self._outputs(news, info))

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _describe(vol: Any) -> VolumeInfo:
        """Separate so a test can make the step after createXML fail."""
        return parse_volume_xml(vol.XMLDesc(0))

    @staticmethod
    def _outputs(props: dict[str, Any], info: VolumeInfo) -> dict[str, Any]:
        return {
            **props,
            "path": info.path,
            "capacity": info.capacity,
            # As found on the host: a rebase done out of band shows up as a diff.
            "basePath": info.backing_path or "",
            "baseFormat": info.backing_format or "",
        }

    @staticmethod
    def _check_base(conn: Any, args: OverlayArgs[str], capacity: int) -> None:
        """Refuse before creating: a missing base, a format that is not the
        base's own (a raw file read as qcow2 is a guest escape), or a base
        larger than the overlay."""
        access, base_path, base_format = args.host, args.base_path, args.base_format
        try:
            base = conn.storageVolLookupByPath(base_path)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
                raise HostResourceMissing(
                    access.where,
                    f"base image {base_path} is not a volume libvirt knows",
                    "create the BaseImage first (or refresh the pool if the file was copied in)",
                ) from None
            raise
        info = parse_volume_xml(base.XMLDesc(0))
        if info.format != base_format:
            raise HostError(
                access.where,
                f"base image {base_path} is {info.format!r}, not {base_format!r}",
                "set the image's format to what the file really is",
            )
        if info.capacity > capacity:
            raise HostError(
                access.where,
                f"overlay {args.name!r} of {human(capacity)} would be smaller than its base "
                f"image {base_path} ({human(info.capacity)} virtual)",
                f"set diskSizeGb to at least {-(-info.capacity // GIB)}",
            )

    @staticmethod
    def _adopt(existing: Any, args: OverlayArgs[str], capacity: int) -> VolumeInfo:
        access, name = args.host, args.name
        info = parse_volume_xml(existing.XMLDesc(0))
        wanted = (args.base_path, args.base_format)
        if info.format != "qcow2" or (info.backing_path, info.backing_format) != wanted:
            raise HostError(
                access.where,
                f"volume {name!r} already exists in pool {access.pool!r} as "
                f"{info.format} backed by {info.backing_path or 'nothing'} "
                f"({info.backing_format or '-'}), not by {wanted[0]} ({wanted[1]})",
                "it is not this proxy's overlay on this image; if its data is not needed, "
                f"delete it (virsh vol-delete --pool {access.pool} {name}) and run again",
            )
        if info.capacity > capacity:
            raise HostError(
                access.where,
                f"volume {name!r} already exists with {human(info.capacity)}, "
                f"more than the {human(capacity)} asked for",
                f"set diskSizeGb to {info.capacity // GIB} to keep it, or delete it and run again",
            )
        if info.capacity < capacity:
            existing.resize(capacity, 0)
            info = parse_volume_xml(existing.XMLDesc(0))
        return info


def _size_change(olds: dict[str, Any], new_size: Any) -> tuple[bool, bool]:
    """(size changes, needs a replacement). A smaller declared size replaces;
    a volume smaller than declared (a larger size, or a shrink done out of
    band and seen by refresh) is grown in place; a volume grown out of band
    beyond the declared size is left alone rather than replaced."""
    if is_unknown(new_size):
        return True, True  # could be a shrink: a preview must never understate losing a disk
    declared = size_bytes(olds.get("sizeGb", 0))
    current = int(olds.get("capacity") or declared)
    wanted = size_bytes(new_size)
    if wanted < declared:
        return True, True
    return wanted > current, False


def _whole_gb(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and float(value).is_integer()
        and 1 <= value <= MAX_SIZE_GB
    )


class Overlay(pulumi.dynamic.Resource):
    """A proxy's disk: inputs ``host``, ``name``, ``basePath``, ``baseFormat``,
    ``sizeGb``; outputs those plus ``path`` and ``capacity`` (bytes). AFTER
    holds its registration back (proxyinfra.rollout.gated)."""

    path: pulumi.Output[str]
    capacity: pulumi.Output[float]

    def __init__(
        self,
        resource_name: str,
        args: OverlayArgs[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
        after: pulumi.Input[str] | None = None,
    ) -> None:
        props = {**args.to_props(), "path": None, "capacity": None}
        props["name"] = gated(props["name"], after)
        fixed_name = pulumi.ResourceOptions(delete_before_replace=True)
        with short_stack_trace():
            super().__init__(
                OverlayProvider(),
                resource_name,
                props,
                pulumi.ResourceOptions.merge(opts, fixed_name),
            )


__all__ = ["Overlay", "OverlayArgs", "OverlayProvider"]
