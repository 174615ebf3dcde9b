"""Programs for tests: the fleet with a stand-in provisioning backend, so the
dispatch, credentials and manifest wiring run before the real backends do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi

from providers.external import ExternalDeployer
from proxyinfra.backend import Deployer, Endpoint, ProxyRequest
from proxyinfra.fleet import build_fleet
from proxyinfra.program import raw_config
from proxyinfra.validation import validate


class RecordingDeployer:
    """Registers one plain resource per proxy, carrying what a real backend gets."""

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint:
        creds = request.credentials
        props: dict[str, Any] = {"proxyId": request.id, "replica": request.replica.name}
        if creds is not None:
            props["passwordHash"] = creds.password_hash
        made = pulumi.CustomResource(
            "test:backend:Machine", request.id, props, pulumi.ResourceOptions(parent=parent)
        )
        host = made.id.apply(lambda i: f"{i}.invalid")
        return Endpoint.of(request, host, request.replica.entry.placement.zone)


def main() -> dict[str, Any]:
    config = validate(raw_config(), Path.cwd())
    deployers: dict[str, Deployer] = {"kvm": RecordingDeployer(), "external": ExternalDeployer()}
    return {"fleet": build_fleet(config, deployers)}
