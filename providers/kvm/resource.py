"""What every kvm dynamic provider shares: the process's start, the host
connection and logging.

Providers are pickled into state, so they keep no connection: the host's
access settings travel as the input ``host`` and the live connection comes
from the connector in place (providers.kvm.connection: the per-process pool
of SSH connections, or the simulated hosts the environment asks for).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from pulumi.dynamic import ResourceProvider

from providers.kvm import simulated
from providers.kvm.access import HostAccess
from providers.kvm.connection import LibvirtSource, source, use_connector
from proxyinfra import logs

log = logging.getLogger("kvm")


_started = False
_start_lock = threading.Lock()
_process = contextlib.ExitStack()  # what start() put in place, for the process's life


def start() -> None:
    """What a provider process does once, before its first call reaches a host
    (idempotent): log levels from the environment and, when the environment
    names a directory of simulated hosts (providers.kvm.simulated), their
    connector put in place through the connection seam for the rest of the
    process."""
    global _started
    with _start_lock:
        if _started:
            return
        _started = True
        logs.configure()
        root = simulated.simulated_root()
        if root is not None:
            _process.enter_context(use_connector(simulated.connector(root)))


class KvmProvider(ResourceProvider):
    """Base of BaseImage, Overlay, SeedIso and ProxyDomain providers."""

    # The pickled provider (by reference: module and class, no state) is kept
    # in each resource's inputs and outputs; the SDK's default makes it a
    # secret, 240 bytes of ciphertext for 80 of plain text, twice per
    # resource. It holds no secret: the SDK still makes it one if it captured
    # a secret Output.
    serialize_as_secret_always = False

    @staticmethod
    def access(props: dict[str, Any]) -> HostAccess:
        return HostAccess.from_props(props["host"])

    def connection(self, props: dict[str, Any]) -> LibvirtSource:
        start()  # the first call in the provider process starts it
        return source(self.access(props))

    def _discard(
        self, props: dict[str, Any], error: BaseException, names: list[str] | None = None
    ) -> None:
        """Remove the volumes a failed create made (default: ``props["name"]``),
        last made first, by name on a fresh lookup (the connection may be what
        failed); never hides the original error, only adds a note when the
        cleanup fails too."""
        from providers.kvm.volumes import delete_volume, lookup_pool

        access = self.access(props)
        names = names if names is not None else [props["name"]]
        if not names:
            return
        try:
            pool = lookup_pool(self.connection(props).libvirt(), access)
            for name in reversed(names):
                delete_volume(pool, name)
        except Exception as cleanup:
            self.logger(access, names[0]).error(
                "could not remove %s after a failed create: %s", ", ".join(names), cleanup
            )
            error.add_note(f"{access.where}: {', '.join(names)} may remain: {cleanup}")

    @staticmethod
    def logger(access: HostAccess, name: str) -> logging.LoggerAdapter[logging.Logger]:
        """`kvm` lines carrying provider, host and resource name."""
        return _Context(
            log, {"context": f"provider={access.provider} host={access.host} name={name}"}
        )


class VolumeProvider(KvmProvider):
    """Base of the providers whose resource is one volume of the host's pool,
    named ``props["name"]`` (Overlay, SeedIso): deleted by that name, and
    deleted already when it is gone."""

    kind = "volume"  # the log line's word for it: "overlay deleted"

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        from providers.kvm.volumes import delete_volume, lookup_pool

        access, name = self.access(props), props["name"]
        if delete_volume(lookup_pool(self.connection(props).libvirt(), access), name):
            self.logger(access, name).info("%s deleted", self.kind)


class _Context(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None
        return f"{self.extra['context']} {msg}", kwargs
