"""The one small interface between the fleet and its backends.

A backend turns a :class:`ProxyRequest` into resources (children of the
proxy's component) and answers with the :class:`Endpoint` crawlers use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pulumi

from proxyinfra.config import Squid
from proxyinfra.plugins import Plugin
from proxyinfra.validation import Replica


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


@dataclass(frozen=True)
class Endpoint:
    host: pulumi.Input[str]
    port: pulumi.Input[int]
    zone: str | None
    username: str | None = None
    password: pulumi.Input[str] | None = None


class Backend(Protocol):
    provisions: bool
    """False for proxies that exist already (no squid, no credentials made)."""

    plugin: Plugin | None
    """The Pulumi resource plugin its resources need (None: none, or dynamic only)."""

    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint: ...
