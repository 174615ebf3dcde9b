"""Names, labels and ports of the discovery service's objects.

Every object is named from project and stack (``discovery-<10 hex>``), so two
stacks can share a namespace, and the same stack keeps its names across runs.
"""

from __future__ import annotations

import hashlib

from providers.kubernetes.labels import PART_OF, PROJECT_LABEL, STACK_LABEL, label_value
from proxyinfra.backend import DiscoveryRequest

API_PORT_NAME = "api"
GATEWAY_PORT_NAME = "gateway"
POSTGRES_PORT = 5432
TOKEN_KEY = "token"
FLEET_KEY = "fleet.json"
URL_KEY = "url"
PASSWORD_KEY = "password"
POSTGRES_USER = "discovery"
POSTGRES_DB = "postgres"
APP_UID = 10001  # the discovery image's user (scripts/build-discovery-images)
POSTGRES_UID = 999  # the postgres image's


def base_name(request: DiscoveryRequest) -> str:
    digest = hashlib.sha256(f"{request.project}\0{request.stack}".encode()).hexdigest()
    return f"discovery-{digest[:10]}"


def selector(request: DiscoveryRequest, component: str) -> dict[str, str]:
    """The pods of one component (``discovery`` or ``database``) of this stack."""
    return {
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/instance": base_name(request),
    }


def labels(request: DiscoveryRequest, component: str) -> dict[str, str]:
    return {
        **selector(request, component),
        "app.kubernetes.io/name": "egress-discovery" if component == "discovery" else "postgres",
        "app.kubernetes.io/managed-by": "pulumi",
        PROJECT_LABEL: label_value(request.project),
        STACK_LABEL: label_value(request.stack),
    }
