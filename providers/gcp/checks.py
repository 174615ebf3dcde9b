"""Rules on a gcp provider entry and on the proxies placed on it, beyond its
model's: zones in the region, images, machine types, label values."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from providers.gcp.config import GCP_IMAGE_PATTERN, GcpImage, GcpProviderEntry
from proxyinfra.checks import Report, label_values, one_of
from proxyinfra.config import ProxyEntry

# GCP label values: lowercase letters, digits, '_' and '-', at most 63 characters.
GCP_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
# Our own GCP label keys start with this (see providers/gcp/labels.py).
RESERVED_GCP_LABEL_PREFIX = "egress-proxies"
IMAGE_PATH_HINT = "projects/P/global/images/family/F"


def check_provider(provider: GcpProviderEntry, path: str, c: Report) -> None:
    gcp = provider.gcp
    for j, zone in enumerate(gcp.zones):
        if not _zone_in_region(zone, gcp.region):
            c.add(f"{path}.gcp.zones[{j}]", f"zone {zone!r} is not in region {gcp.region!r}")


def _zone_in_region(zone: str, region: str) -> bool:
    return re.fullmatch(rf"{re.escape(region)}-[a-z]", zone) is not None


@dataclass(frozen=True)
class GcpTargets:
    """What gcp placement may name; read leniently from the raw entry when the
    provider itself has errors, so placement errors are still all reported."""

    provider: str
    region: str | None
    zones: list[str]
    machine_types: list[str]
    images: dict[str, GcpImage]

    @classmethod
    def of(cls, provider: GcpProviderEntry) -> GcpTargets:
        gcp = provider.gcp
        return cls(
            provider.name, gcp.region, list(gcp.zones), list(gcp.machine_types), dict(gcp.images)
        )

    @classmethod
    def of_raw(cls, entry: Mapping[str, Any]) -> GcpTargets:
        raw = entry.get("gcp")
        gcp: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        region = gcp.get("region") if isinstance(gcp.get("region"), str) else None

        def strings(key: str) -> list[str]:
            value = gcp.get(key)
            return [str(v) for v in value] if isinstance(value, list) else []

        images: dict[str, GcpImage] = {}
        raw_images = gcp.get("images")
        for key, value in raw_images.items() if isinstance(raw_images, Mapping) else []:
            image = value.get("image") if isinstance(value, Mapping) else value
            if isinstance(image, str) and re.fullmatch(GCP_IMAGE_PATTERN, image):
                images[str(key)] = GcpImage(image=image)
        name = str(entry.get("name"))
        return cls(name, region, strings("zones"), strings("machineTypes"), images)


def gcp_zone(targets: GcpTargets, placement_zone: str | None, replica: int) -> str | None:
    """The zone a replica runs in: the placement's, or the provider's zones in turn."""
    if placement_zone is not None:
        return placement_zone
    return targets.zones[replica % len(targets.zones)] if targets.zones else None


def gcp_image(targets: GcpTargets, key: str | None) -> GcpImage | None:
    """The placement's image: a key of `images`, an image path, or the only image."""
    if key is None:
        return next(iter(targets.images.values())) if len(targets.images) == 1 else None
    if key in targets.images:
        return targets.images[key]
    return GcpImage(image=key) if re.fullmatch(GCP_IMAGE_PATTERN, key) else None


def check_placement(proxy: ProxyEntry, targets: GcpTargets, path: str, c: Report) -> None:
    placement = proxy.placement
    where = f"{path}.placement"
    if (
        placement.region is not None
        and targets.region is not None
        and placement.region != targets.region
    ):
        c.add(
            f"{where}.region",
            f"provider {targets.provider!r} is in region {targets.region!r} "
            f"(got {placement.region!r})",
        )
    zone = placement.zone
    if zone is None and not targets.zones:
        c.add(
            f"{where}.zone",
            f"required when provider {targets.provider!r} lists no zones "
            "(or list gcp.zones to spread replicas over them)",
        )
    elif zone is not None and targets.zones and zone not in targets.zones:
        c.add(f"{where}.zone", f"unknown zone {zone!r} (zones: {', '.join(targets.zones)})")
    elif (
        zone is not None
        and targets.region is not None
        and not _zone_in_region(zone, targets.region)
    ):
        c.add(f"{where}.zone", f"zone {zone!r} is not in region {targets.region!r}")
    one_of(placement.machine_type, targets.machine_types, "machineTypes", f"{where}.machineType", c)
    image = gcp_image(targets, placement.image)
    if image is None:
        listed = ", ".join(targets.images) or "none defined"
        what = "required" if placement.image is None else f"unknown image {placement.image!r}"
        c.add(f"{where}.image", f"{what} (images: {listed}; or {IMAGE_PATH_HINT})")
    elif proxy.user_data is not None and image.bootstrap_method != "cloud-init":
        c.add(
            f"{path}.userData",
            f"needs an image with cloud-init; image {image.image!r} boots with a startup "
            "script (set bootstrap: cloud-init on the image if it has cloud-init)",
        )
    label_values(
        proxy,
        GCP_LABEL_VALUE,
        "GCP label values are lowercase letters, digits, '_' or '-', at most 63",
        path,
        c,
    )
    for key in proxy.labels:
        if key.startswith(RESERVED_GCP_LABEL_PREFIX):
            c.add(
                f"{path}.labels.{key}",
                f"keys starting with {RESERVED_GCP_LABEL_PREFIX!r} are the proxies' own GCP labels",
            )
