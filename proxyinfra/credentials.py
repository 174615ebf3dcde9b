"""ProxyCredentials: a basic-auth password generated once per proxy and kept
in state as a Pulumi secret, with the hash squid's password file holds.

A dynamic resource rather than a random value in the program: the password
and its salted hash must stay the same across runs, or every `pulumi up`
would rewrite every proxy's user-data and replace its VM.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ResourceProvider

PASSWORD_BYTES = 18  # 24 URL-safe characters, 144 bits


class ProxyCredentialsProvider(ResourceProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        username = news.get("username")
        failures = []
        if not isinstance(username, str) or not username or ":" in username:
            failures.append(CheckFailure("username", f"not a usable username: {username!r}"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        from proxyinfra.squid import hash_password

        password = secrets.token_urlsafe(PASSWORD_BYTES)
        outs = {
            "username": props["username"],
            "password": password,
            "password_hash": hash_password(password),
        }
        return CreateResult(id_=uuid.uuid4().hex, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = olds.get("username") != news.get("username")
        return DiffResult(changes=changed, replaces=["username"] if changed else [])


class ProxyCredentials(pulumi.dynamic.Resource):
    username: pulumi.Output[str]
    password: pulumi.Output[str]
    password_hash: pulumi.Output[str]

    def __init__(
        self, name: str, username: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        secret_outputs = pulumi.ResourceOptions(
            additional_secret_outputs=["password", "password_hash"]
        )
        super().__init__(
            ProxyCredentialsProvider(),
            name,
            {"username": username, "password": None, "password_hash": None},
            pulumi.ResourceOptions.merge(opts, secret_outputs),
        )
