"""The one small interface between the core and its backends.

A backend is a package of its own (``providers/<name>/``) that exposes one
:class:`Backend` as ``BACKEND``, listed in :mod:`proxyinfra.registry`. It owns
its provider entry's model, the checks of that entry and of the proxies placed
on it, its deployment (a :class:`Deployer` that turns a :class:`ProxyRequest`
into resources and answers with the :class:`Endpoint` crawlers use) and its
operator commands. The core never imports a backend package; backends import
the core (this module, the shared config models, squid and cloud-init).
"""

from __future__ import annotations

import argparse
import builtins
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pulumi

from proxyinfra.checks import Report
from proxyinfra.config import ProviderEntry, ProxyEntry, Replica, Squid
from proxyinfra.plugins import Plugin

if TYPE_CHECKING:
    from proxyinfra.discovery_config import DiscoveryConfig


@dataclass(frozen=True)
class Credentials:
    """Basic-auth credentials of one proxy; password and hash are Pulumi secrets."""

    username: str
    password: pulumi.Output[str]
    password_hash: pulumi.Output[str]


@dataclass(frozen=True)
class ProxyRequest:
    project: str
    stack: str
    id: str  # proxy-<10 hex>
    replica: Replica
    squid: Squid
    credentials: Credentials | None
    # For a backend that ``rolls``: an Output of no value ("") to hold back the
    # resources whose replacement takes the proxy down (proxyinfra/rollout.py).
    after: pulumi.Input[str] | None = None


@dataclass(frozen=True)
class Endpoint:
    host: pulumi.Input[str]
    port: pulumi.Input[int]
    zone: str | None
    username: str | None = None
    password: pulumi.Input[str] | None = None

    @classmethod
    def of(cls, request: ProxyRequest, host: pulumi.Input[str], zone: str | None) -> Endpoint:
        """A provisioned proxy's endpoint: squid's port and the request's credentials."""
        creds = request.credentials
        return cls(
            host=host,
            port=request.squid.port,
            zone=zone,
            username=creds.username if creds else None,
            password=creds.password if creds else None,
        )


class Deployer(Protocol):
    """Makes the resources of one stack's proxies (one instance per program run)."""

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint: ...


# The resource that hands the manifest to a discovery service the stack runs:
# a backend names it so, and the autopilot targets it, so a targeted update
# that changes the fleet also changes what that service reads.
FLEET_RESOURCE = "discovery-fleet-secret"


@dataclass(frozen=True)
class DiscoveryRequest:
    """The discovery service the stack deploys (egress-proxies:discovery) on
    one provider entry: the fleet manifest it serves (a secret Output), the
    secrets the stack generated (None where the config names an existing
    Secret), and the ports of the proxies it must reach."""

    project: str
    stack: str
    config: DiscoveryConfig
    provider: ProviderEntry
    fleet: pulumi.Output[Any]
    token: pulumi.Output[str] | None
    database_password: pulumi.Output[str] | None
    proxy_ports: list[int]


@dataclass(frozen=True)
class DiscoveryEndpoint:
    url: pulumi.Output[str]
    token: pulumi.Output[str]  # secret


@runtime_checkable
class HostsDiscovery(Protocol):
    """A Deployer that can also run the discovery service (kubernetes only)."""

    def deploy_discovery(self, request: DiscoveryRequest) -> DiscoveryEndpoint: ...

    def discovery_problems(
        self, config: DiscoveryConfig, entry: ProviderEntry
    ) -> list[tuple[str, str]]:
        """(config path, problem) of what the service needs there and is
        missing (a Secret the config names), checked before any resource."""


@dataclass(frozen=True)
class Place:
    """Where the replicas of one ``proxies[]`` entry take room (``kvm-home/nas1``)
    and what one more replica takes there, per resource ({"memory": bytes})."""

    name: str
    needs: Mapping[str, int]


class RoomUnknown(Exception):
    """A place's free room could not be read (its host unreachable); the
    message names the place and why."""


@runtime_checkable
class KnowsRoom(Protocol):
    """A backend that can tell how much room its places have for more proxies
    (kvm: a host's free memory and pool space). The others have no limit the
    project knows (docs/autopilot.md, "Room")."""

    def place(self, proxy: ProxyEntry, entry: ProviderEntry) -> Place:
        """Where PROXY's replicas go on ENTRY and what one more needs there."""

    def free(self, proxy: ProxyEntry, entry: ProviderEntry, base_dir: Path) -> Mapping[str, int]:
        """The free amount of each resource at PROXY's place, read now from
        the place itself; raises RoomUnknown when it cannot be read."""


class Backend(Protocol):
    type: str
    """The ``type`` of its provider entries, e.g. ``kvm``."""

    entry_model: builtins.type[ProviderEntry]  # `type` is the attribute above
    """The provider entry's model (``name``, ``type`` and the backend's block)."""

    provisions: bool
    """False for proxies that exist already: no squid, no credentials, no replicas."""

    takes_user_data: bool
    """Whether its proxies boot with cloud-init, so ``userData`` means something."""

    rolls: bool
    """Whether replacing its proxies takes them down (fixed names: deleted
    before they are made again), so that a group's replicas are replaced
    ``maxUnavailable`` at a time: its deployer gives ``ProxyRequest.after``
    to the resources whose replacement deletes the proxy
    (proxyinfra/rollout.py)."""

    adopts_leftovers: bool
    """Whether each create of its resources takes over what a killed run left
    under the same name, so that a run creating only its resources loses
    nothing when the state is written once, at the end
    (``PULUMI_SKIP_CHECKPOINTS``: the autopilot's updates, docs/autopilot.md)."""

    plugin: Plugin | None
    """The Pulumi resource plugin its resources need (None: none, or dynamic only)."""

    pattern_words: Mapping[str, str]
    """Its config patterns in words, for the error messages."""

    def check_provider(self, entry: ProviderEntry, path: str, report: Report) -> None:
        """Rules on the entry beyond its model's (files, names, cross-field)."""

    def check_proxy(
        self,
        proxy: ProxyEntry,
        entry: ProviderEntry | None,
        raw: Mapping[str, Any],
        path: str,
        report: Report,
    ) -> None:
        """Rules on a proxy placed on this provider: its placement, labels,
        URL. ``entry`` is None when the provider entry itself has errors: then
        check what can be checked from its ``raw`` mapping."""

    def check_access(self, entry: ProviderEntry, base_dir: Path) -> str | None:
        """What keeps the stack from reaching this provider's place (a missing
        credential file, an unreachable API), checked by the real program
        before any resource; None when it can be reached or it cannot tell."""

    def deployer(self, base_dir: Path) -> Deployer: ...

    def add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        """Its operator commands under ``python -m proxyinfra``."""
