"""The fleet: one ``Proxy`` component per replica, dispatched to its backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi

from proxyinfra.backend import Credentials, Deployer, Endpoint, ProxyRequest
from proxyinfra.config import Replica, StackConfig
from proxyinfra.credentials import ProxyCredentials
from proxyinfra.manifest import Manifest
from proxyinfra.names import proxy_id
from proxyinfra.partial import Ticket, merged_proxies
from proxyinfra.registry import backends
from proxyinfra.rollout import gate, predecessors
from proxyinfra.stacktrace import short_stack_trace

PROXY_TYPE = "egress-proxies:fleet:Proxy"


class Proxy(pulumi.ComponentResource):
    """One proxy of the fleet, whatever its backend; its children are the
    backend's resources. ``entry`` is its manifest entry (an Output)."""

    entry: pulumi.Output[dict[str, Any]]
    address: pulumi.Output[str]  # where crawlers reach it, once it has one

    def __init__(
        self,
        replica: Replica,
        deployer: Deployer,
        config: StackConfig,
        opts: pulumi.ResourceOptions | None = None,
        after: pulumi.Input[str] | None = None,
    ) -> None:
        with short_stack_trace():
            super().__init__(PROXY_TYPE, replica.name, None, opts)
        project, stack = pulumi.get_project(), pulumi.get_stack()
        self.proxy_id = proxy_id(project, stack, replica.name)
        credentials = None
        provisions = backends()[replica.provider.type].provisions
        if provisions and config.squid.auth is not None:
            made = ProxyCredentials(
                f"{replica.name}-credentials",
                config.squid.auth.username,
                pulumi.ResourceOptions(parent=self),
            )
            credentials = Credentials(
                username=config.squid.auth.username,
                password=made.password,
                password_hash=made.password_hash,
            )
        request = ProxyRequest(
            project=project,
            stack=stack,
            id=self.proxy_id,
            replica=replica,
            squid=config.squid,
            credentials=credentials,
            after=after,
        )
        endpoint = deployer.deploy(request, self)
        self.address = pulumi.Output.from_input(endpoint.host)
        self.entry = pulumi.Output.from_input(_manifest_entry(request, endpoint))
        # The entry is kept once in the state, in the stack's `fleet` output:
        # not again in the component's (the proxy's password with it, when
        # it has one). Nothing reads a component's outputs back.
        self.register_outputs({"id": self.proxy_id})


def _manifest_entry(request: ProxyRequest, endpoint: Endpoint) -> dict[str, Any]:
    replica = request.replica
    entry: dict[str, Any] = {
        "name": replica.name,
        "id": request.id,
        "provider": replica.provider.name,
        "type": replica.provider.type,
        "zone": endpoint.zone,
        "host": endpoint.host,
        "port": endpoint.port,
        "labels": dict(replica.entry.labels),
    }
    if endpoint.username is not None and endpoint.password is not None:
        entry["auth"] = {"username": endpoint.username, "password": endpoint.password}
    return entry


def build_fleet(
    config: StackConfig,
    deployers: Mapping[str, Deployer],
    partial: Ticket | None = None,
    previous: pulumi.Output[Any] | None = None,
) -> pulumi.Output[Any]:
    """Register the proxies and return the manifest (stack output ``fleet``).

    Every replica, or in a partial run (proxyinfra/partial.py) only the
    ticket's, the others' entries taken from PREVIOUS (the stack's last
    ``fleet``), so the manifest is the same either way. In a whole run each
    replica waits for its predecessor (proxyinfra/rollout.py); a partial run
    registers only replicas that come, which take nothing down."""
    replicas = config.replicas()
    chosen = [r for r in replicas if partial is None or r.name in partial.replicas]
    waits = predecessors(replicas) if partial is None else {}
    made: dict[str, Proxy] = {}
    for replica in chosen:
        after = None
        if partial is None and backends()[replica.provider.type].rolls:
            before = made.get(waits.get(replica.name, ""))
            after = gate(before.address if before is not None else None)
        made[replica.name] = Proxy(replica, deployers[replica.provider.type], config, after=after)
    proxies = list(made.values())
    header = {"version": 1, "project": pulumi.get_project(), "stack": pulumi.get_stack()}
    order = [r.name for r in replicas]

    def manifest(previous_fleet: Any, *entries: dict[str, Any]) -> dict[str, Any]:
        registered = {entry["name"]: entry for entry in entries}
        listed = (
            list(entries) if partial is None else merged_proxies(order, registered, previous_fleet)
        )
        # Through the model: what the stack exports is what discovery accepts.
        return Manifest.model_validate({**header, "proxies": listed}).document()

    return pulumi.Output.all(previous, *[p.entry for p in proxies]).apply(
        lambda values: manifest(*values)
    )
