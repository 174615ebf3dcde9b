"""The Secrets a discovery block names, asked of the cluster before any
resource (providers/kubernetes/discovery/preflight.py), on a fake API."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx

from providers.kubernetes.config import KubernetesProvider
from providers.kubernetes.discovery.preflight import secret_problems
from proxyinfra.discovery_config import DiscoveryConfig


def block(**database: object) -> DiscoveryConfig:
    return DiscoveryConfig.model_validate(
        {
            "provider": "cluster",
            "image": "localhost/d:1",
            "allowedClients": ["10.0.0.0/8"],
            "token": {"existingSecret": {"name": "crawler-token", "key": "token"}},
            "database": database or {"existingSecret": {"name": "db", "key": "url"}},
        }
    )


def api(secrets: dict[str, dict[str, str]], asked: list[str]):  # type: ignore[no-untyped-def]
    def get(path: str) -> httpx.Response:
        asked.append(path)
        name = path.rsplit("/", 1)[1]
        if name == "forbidden":
            return httpx.Response(403)
        if name not in secrets:
            return httpx.Response(404)
        data = {k: base64.b64encode(v.encode()).decode() for k, v in secrets[name].items()}
        return httpx.Response(200, json={"data": data})

    return get


def test_missing_secrets_and_keys_are_named_by_path(tmp_path: Path) -> None:
    asked: list[str] = []
    config = KubernetesProvider(namespace="egress")
    get = api({"crawler-token": {"other": "x"}}, asked)
    assert secret_problems(block(), config, tmp_path, get) == [
        (
            "discovery.token.existingSecret",
            "Secret 'crawler-token' has no key 'token' (keys: other)",
        ),
        ("discovery.database.existingSecret", "Secret 'db' does not exist in namespace 'egress'"),
    ]
    assert asked == [
        "/api/v1/namespaces/egress/secrets/crawler-token",
        "/api/v1/namespaces/egress/secrets/db",
    ]


def test_present_secrets_and_answers_it_cannot_judge_pass(tmp_path: Path) -> None:
    config = KubernetesProvider(namespace="egress")
    good = api({"crawler-token": {"token": "t"}, "db": {"url": "postgresql://h/d"}}, [])
    assert secret_problems(block(), config, tmp_path, good) == []
    forbidden = block(existingSecret={"name": "forbidden", "key": "url"})
    assert secret_problems(forbidden, config, tmp_path, good) == []


def test_nothing_is_asked_when_the_stack_makes_its_own(tmp_path: Path) -> None:
    asked: list[str] = []
    own = DiscoveryConfig.model_validate(
        {
            "provider": "cluster",
            "image": "localhost/d:1",
            "allowedClients": ["10.0.0.0/8"],
            "database": {"postgres": {"image": "localhost/p:1"}},
        }
    )
    assert secret_problems(own, KubernetesProvider(), tmp_path, api({}, asked)) == []
    assert asked == []
