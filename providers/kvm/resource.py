"""What every kvm dynamic provider shares: the host connection and logging.

Providers are pickled into state, so they keep no connection: the host's
access settings travel as the input ``host`` and the live connection comes
from the per-process pool in providers.kvm.connection.
"""

from __future__ import annotations

import logging
from typing import Any

from pulumi.dynamic import ResourceProvider

from providers.kvm.access import HostAccess
from providers.kvm.connection import HostConnection, connect
from proxyinfra import logs

log = logging.getLogger("kvm")


class KvmProvider(ResourceProvider):
    """Base of BaseImage, Overlay, SeedIso and ProxyDomain providers."""

    @staticmethod
    def access(props: dict[str, Any]) -> HostAccess:
        return HostAccess.from_props(props["host"])

    def connection(self, props: dict[str, Any]) -> HostConnection:
        logs.configure()  # first call in the provider process sets levels from the env
        return connect(self.access(props))

    @staticmethod
    def logger(access: HostAccess, name: str) -> logging.LoggerAdapter[logging.Logger]:
        """`kvm` lines carrying provider, host and resource name."""
        return _Context(
            log, {"context": f"provider={access.provider} host={access.host} name={name}"}
        )


class _Context(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None
        return f"{self.extra['context']} {msg}", kwargs
