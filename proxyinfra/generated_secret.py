"""GeneratedSecret: a random value made once and kept in state as a Pulumi
secret (the discovery service's bearer token, its PostgreSQL password).

A dynamic resource, as proxyinfra/credentials.py's passwords are, rather
than a random value in the program: the value must stay the same across
runs, or every `pulumi up` would hand crawlers a new token and lock the
service out of its own database. URL-safe characters only, so the value can
stand in a URL's user info and in an HTTP header as it is.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ResourceProvider

MIN_BYTES = 16


class GeneratedSecretProvider(ResourceProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        size = news.get("bytes")
        failures = []
        if not isinstance(size, int | float) or int(size) != size or size < MIN_BYTES:
            failures.append(CheckFailure("bytes", f"at least {MIN_BYTES} whole bytes: {size!r}"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        value = secrets.token_urlsafe(int(props["bytes"]))
        return CreateResult(id_=uuid.uuid4().hex, outs={"bytes": props["bytes"], "value": value})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Numbers come back from the engine as floats.
        changed = float(olds.get("bytes") or 0) != float(news.get("bytes") or 0)
        return DiffResult(changes=changed, replaces=["bytes"] if changed else [])


class GeneratedSecret(pulumi.dynamic.Resource):
    value: pulumi.Output[str]

    def __init__(self, name: str, size: int = 32, opts: pulumi.ResourceOptions | None = None):
        secret = pulumi.ResourceOptions(additional_secret_outputs=["value"])
        super().__init__(
            GeneratedSecretProvider(),
            name,
            {"bytes": size, "value": None},
            pulumi.ResourceOptions.merge(opts, secret),
        )
