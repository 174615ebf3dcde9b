"""Kubernetes labels marking a proxy's objects with project, stack and logical name."""

from __future__ import annotations

import re

from proxyinfra.backend import ProxyRequest

PART_OF = "egress-proxies"
PROJECT_LABEL = "egress-proxies/project"
STACK_LABEL = "egress-proxies/stack"
# Pod Security admission: the level the namespace the stack creates enforces.
POD_SECURITY_LABEL = "pod-security.kubernetes.io/enforce"
NAME_LABEL = "egress-proxies/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"


def label_value(text: str) -> str:
    """A label value: at most 63 of [-_.A-Za-z0-9], alphanumeric at both ends.

    Only the stack's own names are folded here; users' values are checked in
    validation instead.
    """
    value = re.sub(r"[^-_.A-Za-z0-9]", "-", text)[:63]
    return value.strip("-_.")


def selector(request: ProxyRequest) -> dict[str, str]:
    """Selects this proxy's pod only: the id is unique per project, stack and replica."""
    return {"app.kubernetes.io/part-of": PART_OF, INSTANCE_LABEL: request.id}


def stack_selector(request: ProxyRequest) -> dict[str, str]:
    """Every proxy pod of this stack (for spreading them over nodes)."""
    return {"app.kubernetes.io/part-of": PART_OF, STACK_LABEL: label_value(request.stack)}


def proxy_labels(request: ProxyRequest) -> dict[str, str]:
    return {
        **request.replica.entry.labels,
        "app.kubernetes.io/name": "squid",
        "app.kubernetes.io/component": "egress-proxy",
        "app.kubernetes.io/managed-by": "pulumi",
        PROJECT_LABEL: label_value(request.project),
        NAME_LABEL: request.replica.name,
        **stack_selector(request),
        **selector(request),
    }
