"""Find (and remove) what a stack left on its libvirt hosts that its state
does not own: domains by their metadata, overlay and seed volumes by name.

A volume name carries a proxy id, not the stack: a volume is this stack's when
its id is one of the stack's ids (from the config, the state, or the metadata
of this stack's domains on the host). Volumes of other stacks sharing the host
are therefore never touched.

Cached base images belong to no stack (BaseImage keeps them on delete, see
keepOnDestroy): `find_unused_bases` lists those nothing in the pool backs onto
and the stack's state does not hold, for `gc --bases`.
"""

from __future__ import annotations

import contextlib
import posixpath
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.domainxml import NS_URI, parse_metadata
from providers.kvm.volumes import backing_paths, parse_volume_xml
from proxyinfra.names import BASE_PREFIX, base_marker_volume

VOLUME_RE = re.compile(r"^(proxy-[0-9a-f]{10})(\.qcow2|-seed\.iso)$")
BASE_RE = re.compile(
    rf"^{re.escape(BASE_PREFIX)}(?:[0-9a-f]{{16}}|u[0-9a-f]{{15}})\.(?:qcow2|raw)$"
)
UNDEFINE_FLAGS = libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE


@dataclass(frozen=True)
class Orphan:
    host: str
    kind: Literal["domain", "volume"]
    name: str
    age_seconds: float | None
    detail: str


# Another stack's create or destroy may remove a domain or volume between
# the listing and the read: gone, it is nobody's orphan.
_GONE = frozenset({libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_NO_STORAGE_VOL})


class _Gone(Exception):
    pass


def _domain_marks(dom: Any) -> Any | None:
    try:
        return parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS_URI, 0))
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_METADATA:
            return None
        if error.get_error_code() in _GONE:
            raise _Gone from error
        raise
    except ValueError:
        return None  # someone else's malformed element: not ours to judge


def _volume_age(vol: Any, now: datetime) -> float | None:
    try:
        return _age_in(vol.XMLDesc(0), now)
    except libvirt.libvirtError as error:
        if error.get_error_code() in _GONE:
            raise _Gone from error
        raise


def _age_in(xml: str, now: datetime) -> float | None:
    root = ET.fromstring(xml)
    stamp = root.findtext("target/timestamps/mtime") or root.findtext("target/timestamps/ctime")
    return now.timestamp() - float(stamp) if stamp else None


def find_orphans(
    conn: Any,
    access: HostAccess,
    project: str,
    stack: str,
    owned: set[str],
    stack_ids: set[str],
    min_age_seconds: float,
    now: datetime | None = None,
) -> list[Orphan]:
    """Objects of (project, stack) on this host that `owned` does not list."""
    now = now or datetime.now(UTC)
    orphans: list[Orphan] = []
    ids = set(stack_ids)
    other_domains: set[str] = set()
    for dom in conn.listAllDomains(0):
        try:
            marks = _domain_marks(dom)
        except _Gone:
            continue
        name = dom.name()
        if marks is None or not marks.managed or (marks.project, marks.stack) != (project, stack):
            other_domains.add(name)
            continue
        ids.add(name)
        if name in owned:
            continue
        age = (now - marks.created).total_seconds()
        if age >= min_age_seconds:
            orphans.append(Orphan(access.host, "domain", name, age, f"logical name {marks.name!r}"))
    pool = conn.storagePoolLookupByName(access.pool)
    for vol in pool.listAllVolumes(0):
        match = VOLUME_RE.match(vol.name())
        if match is None or vol.name() in owned:
            continue
        proxy = match.group(1)
        if proxy not in ids or proxy in other_domains:
            continue
        try:
            age = _volume_age(vol, now)
        except _Gone:
            continue
        if age is None or age >= min_age_seconds:
            what = "overlay" if match.group(2) == ".qcow2" else "seed"
            orphans.append(
                Orphan(access.host, "volume", vol.name(), age, f"{what} in pool {access.pool}")
            )
    return orphans


def find_unused_bases(
    conn: Any,
    access: HostAccess,
    owned: set[str],
    min_age_seconds: float,
    now: datetime | None = None,
) -> list[Orphan]:
    """Base images (each marker listed before its base) in the host's pool that no
    volume backs onto and `owned` does not list; a later create downloads them again."""
    now = now or datetime.now(UTC)
    pool = conn.storagePoolLookupByName(access.pool)
    volumes = {v.name(): v for v in pool.listAllVolumes(0)}
    unused: list[Orphan] = []
    in_use: set[str] | None = None  # read only when a candidate needs it
    for name, vol in sorted(volumes.items()):
        if not BASE_RE.match(name) or name in owned:
            continue
        xml = vol.XMLDesc(0)
        age = _age_in(xml, now)
        if age is not None and age < min_age_seconds:
            continue
        if in_use is None:
            in_use = backing_paths(volumes)
        if posixpath.normpath(parse_volume_xml(xml).path) in in_use:
            continue
        marker = base_marker_volume(name)
        detail = f"cached base image in pool {access.pool}, nothing backs onto it"
        if marker in volumes:
            unused.append(Orphan(access.host, "volume", marker, age, f"marker of {name}"))
        unused.append(Orphan(access.host, "volume", name, age, detail))
    return unused


def remove(conn: Any, access: HostAccess, orphans: Iterable[Orphan]) -> None:
    """Domains first (they hold their volumes), then volumes in the order given
    (a base's marker before the base: a base without marker counts as broken)."""
    for orphan in sorted(orphans, key=lambda o: o.kind != "domain"):
        if orphan.kind == "domain":
            dom = conn.lookupByName(orphan.name)
            if dom.isActive():
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
            dom.undefineFlags(UNDEFINE_FLAGS)
        else:
            conn.storagePoolLookupByName(access.pool).storageVolLookupByName(orphan.name).delete(0)
