"""A base image's inputs: the typed arguments, the checks behind ``check``
and the host comparison behind ``diff``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import httpx
from pulumi.dynamic import CheckFailure

from providers.kvm.access import HostAccess
from providers.kvm.args import Change, ResourceArgs, arg, is_unknown
from providers.kvm.basevolumes import SHA256_HEX
from providers.kvm.download import shown_url
from proxyinfra.names import base_marker_volume, base_volume

FORMATS = ("qcow2", "raw")
# Where a base lives; the other host fields only say how to get there.
HOST_IDENTITY = ("address", "port", "socket", "pool")


@dataclass(frozen=True)
class BaseImageArgs(ResourceArgs):
    """BaseImage's inputs. The volumes are named by content, so what replaces
    a base is a change of its content: ``volume``/``marker`` (from url,
    sha256, format), ``sha256`` or ``format``. The rest is recorded in place,
    with two exceptions decided in ``diff``: ``host`` when it names another
    host or pool, and ``url`` together with a new name."""

    host: HostAccess = arg("host", Change.UPDATE, HostAccess)
    url: str = arg("url", Change.UPDATE, str)  # a mirror of the same digest: same content
    sha256: str | None = arg("sha256", Change.REPLACE, str, optional=True)
    format: str = arg("format", Change.REPLACE, str)
    volume: str = arg("volume", Change.REPLACE, str)
    marker: str = arg("marker", Change.REPLACE, str)
    keep: bool = arg("keep", Change.UPDATE, bool)  # delete leaves the volumes as a cache

    @classmethod
    def of(cls, host: HostAccess, url: str, sha256: str | None, format: str, keep: bool) -> Self:
        """With the content-derived volume names."""
        volume = base_volume(url, sha256, format)
        return cls(host, url, sha256, format, volume, base_marker_volume(volume), keep)


def input_failures(news: dict[str, Any]) -> list[CheckFailure]:
    unknown = {k for k, v in news.items() if is_unknown(v)}  # preview: not known yet
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


def _access(value: Any) -> HostAccess | None:
    try:
        return HostAccess.from_props(value)
    except (TypeError, ValueError, AttributeError):
        return None


def host_moved(old: Any, new: Any) -> bool:
    before, after = _access(old), _access(new)
    if before is None or after is None:
        return True
    return any(getattr(before, k) != getattr(after, k) for k in HOST_IDENTITY)
