"""ProxyCredentials through the engine's path: `python -m pulumi.dynamic` over gRPC."""

from __future__ import annotations

import bcrypt
import pytest

from proxyinfra.credentials import ProxyCredentialsProvider
from tests.harness.engine import ProviderError, ProviderProcess, make_urn, provider_inputs

URN = make_urn("home-0-credentials")


def inputs(username: str) -> dict[str, object]:
    return provider_inputs(
        ProxyCredentialsProvider(), {"username": username, "password": None, "password_hash": None}
    )


def test_create_makes_a_password_with_a_matching_hash(engine: ProviderProcess) -> None:
    checked = engine.check(URN, {}, inputs("crawler"))
    assert checked.failures == []
    created = engine.create(URN, checked.inputs)
    props = created.properties
    password, digest = props["password"], props["password_hash"]
    assert props["username"] == "crawler"
    assert len(password) == 24
    assert bcrypt.checkpw(password.encode(), digest.encode())
    again = engine.create(URN, checked.inputs)
    assert again.properties["password"] != password  # generated, not derived


def test_same_username_is_no_change_and_a_new_one_replaces(engine: ProviderProcess) -> None:
    created = engine.create(URN, inputs("crawler"))
    olds = created.properties
    assert engine.diff(created.id, URN, olds, inputs("crawler")).action == "same"
    changed = engine.diff(created.id, URN, olds, inputs("robot"))
    assert changed.action == "replace"
    assert changed.replaces == ["username"]


def test_check_refuses_an_unusable_username(engine: ProviderProcess) -> None:
    checked = engine.check(URN, {}, inputs("a:b"))
    assert checked.failures == [("username", "not a usable username: 'a:b'")]
    with pytest.raises(ProviderError):
        engine.create(URN, {"__provider": inputs("x")["__provider"]})
