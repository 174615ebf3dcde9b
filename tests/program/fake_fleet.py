"""Programs for tests: the fleet with a stand-in provisioning backend, so the
dispatch, credentials and manifest wiring run before the real backends do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi

from providers.external import ExternalBackend
from proxyinfra.backend import Endpoint, ProxyRequest
from proxyinfra.fleet import build_fleet
from proxyinfra.program import raw_config
from proxyinfra.validation import validate


class RecordingBackend:
    """Registers one plain resource per proxy, carrying what a real backend gets."""

    provisions = True

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint:
        creds = request.credentials
        props: dict[str, Any] = {"proxyId": request.id, "replica": request.replica.name}
        if creds is not None:
            props["passwordHash"] = creds.password_hash
        made = pulumi.CustomResource(
            "test:backend:Machine", request.id, props, pulumi.ResourceOptions(parent=parent)
        )
        return Endpoint(
            host=made.id.apply(lambda i: f"{i}.invalid"),
            port=request.squid.port,
            zone=request.replica.entry.placement.zone,
            username=creds.username if creds else None,
            password=creds.password if creds else None,
        )


def main() -> dict[str, Any]:
    config = validate(raw_config(), Path.cwd())
    backends = {"kvm": RecordingBackend(), "external": ExternalBackend()}
    return {"fleet": build_fleet(config, backends)}  # type: ignore[dict-item]
