"""The external backend: proxies that exist already. Nothing is provisioned;
they are only listed in the manifest, so the discovery service probes and
leases them."""

from __future__ import annotations

import argparse
import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import pulumi

from proxyinfra.backend import Backend, Deployer, Endpoint, ProxyRequest
from proxyinfra.checks import Report
from proxyinfra.config import ProviderEntry, ProxyEntry
from proxyinfra.plugins import Plugin


class ExternalProviderEntry(ProviderEntry):
    """Proxies that exist already: probed and leased, never provisioned."""

    type: Literal["external"]


class ExternalDeployer:
    def deploy(self, request: ProxyRequest, parent: pulumi.Resource) -> Endpoint:
        url = request.replica.entry.url
        assert url is not None  # validation guarantees it
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        password = unquote(parts.password) if parts.password is not None else None
        return Endpoint(
            host=parts.hostname,
            port=parts.port,
            zone=None,
            username=unquote(parts.username) if parts.username is not None else None,
            password=pulumi.Output.secret(password) if password is not None else None,
        )


class ExternalBackend:
    type = "external"
    entry_model: builtins.type[ProviderEntry] = ExternalProviderEntry
    provisions = False
    takes_user_data = False
    rolls = False
    adopts_leftovers = False  # nothing of its own is created
    plugin: Plugin | None = None
    pattern_words: Mapping[str, str] = {}

    def check_provider(self, entry: ProviderEntry, path: str, report: Report) -> None:
        pass  # a name and a type: the model holds them

    def check_proxy(
        self,
        proxy: ProxyEntry,
        entry: ProviderEntry | None,
        raw: Mapping[str, Any],
        path: str,
        report: Report,
    ) -> None:
        c = report
        if proxy.replicas is not None:
            c.add(f"{path}.replicas", "not allowed for an external proxy: one entry per URL")
        if proxy.placement.model_dump(exclude_none=True):
            c.add(f"{path}.placement", "not allowed for an external proxy")
        if proxy.user_data is not None:
            c.add(f"{path}.userData", "not allowed for an external proxy")
        if proxy.url is None:
            c.add(f"{path}.url", "required for an external proxy (http://[user:pass@]host:port)")
            return
        try:
            parts = urlsplit(proxy.url)
            port = parts.port
        except ValueError:
            parts, port = None, None
        # Never echo the URL: it may carry the proxy's password.
        if parts is None or parts.scheme != "http" or not parts.hostname or port is None:
            c.add(
                f"{path}.url",
                f"must be http://[user:pass@]host:port (got scheme {parts.scheme if parts else '?'!r},"
                f" host {parts.hostname if parts else None!r}, port {port!r})",
            )
        elif parts.path not in ("", "/") or parts.query or parts.fragment:
            c.add(f"{path}.url", "must not have a path, query or fragment")

    def deployer(self, base_dir: Path) -> Deployer:
        return ExternalDeployer()

    def check_access(self, entry: ProviderEntry, base_dir: Path) -> None:
        return None  # nothing to reach before the provider plugin does

    def add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        pass  # none


BACKEND: Backend = ExternalBackend()
