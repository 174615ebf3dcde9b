"""Proxies that exist already: nothing is provisioned, they are only listed
in the manifest, so the discovery service probes and leases them."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import pulumi

from proxyinfra.backend import Endpoint, ProxyRequest
from proxyinfra.plugins import Plugin


class ExternalBackend:
    plugin: Plugin | None = None
    provisions = False

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
