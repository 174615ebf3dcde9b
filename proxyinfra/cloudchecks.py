"""Config checks of the gcp and kubernetes providers and their proxies' placement.

Called by :mod:`proxyinfra.validation`, which collects every error with its
path; kept apart so that module stays about the config as a whole.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from proxyinfra.config import (
    GCP_IMAGE_PATTERN,
    GcpImage,
    GcpProviderEntry,
    KubernetesProviderEntry,
    ProxyEntry,
)

# GCP label values: lowercase letters, digits, '_' and '-', at most 63 characters.
GCP_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
# Kubernetes label values: alphanumeric at both ends, '-', '_' and '.' inside.
K8S_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
# Our own GCP label keys start with this (see providers/gcp/labels.py).
RESERVED_GCP_LABEL_PREFIX = "egress-proxies"
IMAGE_PATH_HINT = "projects/P/global/images/family/F"

_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_SCALE = {
    None: 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}


_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


@dataclass(frozen=True)
class ClientRanges:
    """allowedClients as the network layer needs them: per address family, collapsed,
    IPv4-mapped IPv6 ranges (``::ffff:10.0.0.0/104``) written as the IPv4 they are."""

    v4: list[str]
    v6: list[str]

    @property
    def all(self) -> list[str]:
        return [*self.v4, *self.v6]

    @property
    def everyone(self) -> list[str]:
        """The families whose every address is admitted ("IPv4", "IPv6")."""
        found = ["IPv4"] if self.v4 == ["0.0.0.0/0"] else []
        return found + (["IPv6"] if self.v6 == ["::/0"] else [])


def client_ranges(cidrs: Sequence[str]) -> ClientRanges:
    """Collapse CIDRs the way squid sees them: IPv4 as IPv4-mapped IPv6, so
    ``::/1`` holds every IPv4 address and ranges may cover each other across
    families."""
    mapped: list[ipaddress.IPv6Network] = []
    for cidr in cidrs:
        net = ipaddress.ip_network(cidr)
        if isinstance(net, ipaddress.IPv4Network):
            net = ipaddress.IPv6Network(f"::ffff:{net.network_address}/{96 + net.prefixlen}")
        mapped.append(net)
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for net in ipaddress.collapse_addresses(mapped):
        if net.subnet_of(_V4_MAPPED):
            v4.append(_unmapped(net))
            continue
        v6.append(net)
        if _V4_MAPPED.subnet_of(net):  # e.g. ::/1 also admits every IPv4 client
            v4.append(ipaddress.IPv4Network("0.0.0.0/0"))
    v4 = list(ipaddress.collapse_addresses(v4))
    return ClientRanges([str(n) for n in v4], [str(n) for n in v6])


def _unmapped(net: ipaddress.IPv6Network) -> ipaddress.IPv4Network:
    address = ipaddress.IPv4Address(int(net.network_address) & 0xFFFFFFFF)
    return ipaddress.IPv4Network(f"{address}/{net.prefixlen - 96}")


class Report(Protocol):
    warnings: list[str]

    def add(self, path: str, message: str) -> None: ...


def quantity(value: str) -> float:
    """A Kubernetes quantity ("500m", "64Mi") as a number; the config pattern holds."""
    match = _QUANTITY.fullmatch(value)
    assert match is not None
    return float(match.group(1)) * _SCALE[match.group(2)]


# --- providers ---------------------------------------------------------------


def check_gcp_provider(provider: GcpProviderEntry, path: str, c: Report) -> None:
    gcp = provider.gcp
    for j, zone in enumerate(gcp.zones):
        if not _zone_in_region(zone, gcp.region):
            c.add(f"{path}.gcp.zones[{j}]", f"zone {zone!r} is not in region {gcp.region!r}")


def check_kubernetes_provider(
    provider: KubernetesProviderEntry, path: str, kubeconfig: Path | None, c: Report
) -> None:
    k8s = provider.kubernetes
    if kubeconfig is not None and not kubeconfig.is_file():
        c.add(f"{path}.kubernetes.kubeconfig", f"file not found: {kubeconfig}")
    for what in ("cpu", "memory"):
        request = getattr(k8s, f"{what}_request")
        limit = getattr(k8s, f"{what}_limit")
        if quantity(request) > quantity(limit):
            c.add(
                f"{path}.kubernetes.{what}Request",
                f"{request!r} is above {what}Limit {limit!r}; Kubernetes refuses such a pod",
            )
    if not _pinned(k8s.image):
        c.warnings.append(
            f"{path}.kubernetes.image {k8s.image!r} is not pinned (no @sha256 digest): "
            "a tag can move, so pods may run an image nobody reviewed"
        )


def _pinned(image: str) -> bool:
    return re.search(r"@sha256:[0-9a-f]{64}$", image) is not None


def _zone_in_region(zone: str, region: str) -> bool:
    return re.fullmatch(rf"{re.escape(region)}-[a-z]", zone) is not None


# --- placement -----------------------------------------------------------------


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
    def of_raw(cls, name: str, entry: Mapping[str, Any]) -> GcpTargets:
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


def check_gcp_placement(proxy: ProxyEntry, targets: GcpTargets, path: str, c: Report) -> None:
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
    _check_choice(
        placement.machine_type, targets.machine_types, "machineTypes", f"{where}.machineType", c
    )
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
    _check_labels(
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


def check_kubernetes_placement(proxy: ProxyEntry, path: str, c: Report) -> None:
    placement = proxy.placement
    for key, value in (
        ("machineType", placement.machine_type),
        ("image", placement.image),
        ("region", placement.region),
    ):
        if value is not None:
            c.add(f"{path}.placement.{key}", f"not used by kubernetes proxies (got {value!r})")
    if placement.zone is not None and not K8S_LABEL_VALUE.fullmatch(placement.zone):
        c.add(f"{path}.placement.zone", f"not a node zone label value (got {placement.zone!r})")
    _check_labels(
        proxy,
        K8S_LABEL_VALUE,
        "Kubernetes label values are letters, digits, '-', '_' or '.', alphanumeric at both "
        "ends, at most 63",
        path,
        c,
    )


def _check_labels(
    proxy: ProxyEntry, rule: re.Pattern[str], words: str, path: str, c: Report
) -> None:
    for key, value in proxy.labels.items():
        if not rule.fullmatch(value):
            c.add(f"{path}.labels.{key}", f"{words} (got {value!r})")


def _check_choice(
    value: str | None, choices: Sequence[str], what: str, path: str, c: Report
) -> None:
    listed = ", ".join(choices) or "none defined"
    if value is None:
        c.add(path, f"required ({what}: {listed})")
    elif value not in choices:
        c.add(path, f"unknown {what.rstrip('s')} {value!r} ({what}: {listed})")
