"""Rules on a kubernetes provider entry and on the proxies placed on it,
beyond its model's: the kubeconfig file, requests within limits, a pinned
image, placement and label values."""

from __future__ import annotations

import re

from providers.kubernetes.config import KubernetesProviderEntry
from proxyinfra.checks import Report, file_exists, label_values
from proxyinfra.config import ProxyEntry

# Kubernetes label values: alphanumeric at both ends, '-', '_' and '.' inside.
K8S_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")

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


def quantity(value: str) -> float:
    """A Kubernetes quantity ("500m", "64Mi") as a number; the config pattern holds."""
    match = _QUANTITY.fullmatch(value)
    assert match is not None
    return float(match.group(1)) * _SCALE[match.group(2)]


def check_provider(provider: KubernetesProviderEntry, path: str, c: Report) -> None:
    k8s = provider.kubernetes
    if k8s.kubeconfig is not None:
        file_exists(k8s.kubeconfig, f"{path}.kubernetes.kubeconfig", c)
    if k8s.service_type == "LoadBalancer" and k8s.manifest_address != "serviceDNS":
        c.add(
            f"{path}.kubernetes.manifestAddress",
            f"{k8s.manifest_address!r} is for ClusterIP Services; a LoadBalancer's proxies "
            "are listed by their load balancer address",
        )
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


def check_placement(proxy: ProxyEntry, path: str, c: Report) -> None:
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
    label_values(
        proxy,
        K8S_LABEL_VALUE,
        "Kubernetes label values are letters, digits, '-', '_' or '.', alphanumeric at both "
        "ends, at most 63",
        path,
        c,
    )
