"""Before any resource: the Secrets the discovery block names (an existing
token, an existing database URL) exist in the namespace and hold their key.

Read with the kubeconfig's own credentials (client certificate or bearer
token); with credentials this cannot use (an exec plugin, say) or an answer
other than 200 or 404, it cannot tell and says nothing: the pods would then
fail to start, which pulumi-kubernetes' await reports.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from providers.kubernetes.access import AccessError, api_server
from providers.kubernetes.config import KubernetesProvider
from proxyinfra.discovery_config import DiscoveryConfig, SecretRef

Get = Callable[[str], httpx.Response]


def secret_problems(
    discovery: DiscoveryConfig, config: KubernetesProvider, base_dir: Path, get: Get | None = None
) -> list[tuple[str, str]]:
    """(config path, problem) of each named Secret that is missing or lacks its key."""
    named = [
        ("discovery.token.existingSecret", discovery.token.existing_secret),
        ("discovery.database.existingSecret", discovery.database.existing_secret),
    ]
    wanted = [(path, ref) for path, ref in named if ref is not None]
    if not wanted:
        return []
    if get is None:
        try:
            client = _client(config, base_dir)
        except (AccessError, OSError, KeyError, ValueError, ssl.SSLError):
            return []  # access_problem names what is wrong with the kubeconfig
        if client is None:
            return []
        get = client.get
    problems = []
    for path, ref in wanted:
        problem = _problem(ref, config.namespace, get)
        if problem is not None:
            problems.append((path, problem))
    return problems


def _problem(ref: SecretRef, namespace: str, get: Get) -> str | None:
    try:
        answer = get(f"/api/v1/namespaces/{namespace}/secrets/{ref.name}")
    except httpx.HTTPError:
        return None
    if answer.status_code == 404:
        return f"Secret {ref.name!r} does not exist in namespace {namespace!r}"
    if answer.status_code != 200:
        return None
    data = answer.json().get("data") or {}
    if ref.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        return f"Secret {ref.name!r} has no key {ref.key!r} (keys: {keys})"
    return None


def _client(config: KubernetesProvider, base_dir: Path) -> httpx.Client | None:
    server = api_server(config, base_dir)
    doc = yaml.safe_load(Path(server.source.split(":")[0]).read_text())
    context = _named(doc, "contexts", server.context)
    cluster = _named(doc, "clusters", str(context.get("cluster")))
    user = _named(doc, "users", str(context.get("user")))
    files = tempfile.TemporaryDirectory(prefix="discovery-preflight-")
    tls = ssl.create_default_context()
    if cluster.get("certificate-authority-data"):
        tls = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif cluster.get("certificate-authority"):
        tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    headers = {}
    if user.get("client-certificate-data") and user.get("client-key-data"):
        cert, key = Path(files.name) / "cert", Path(files.name) / "key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        key.chmod(0o600)
        tls.load_cert_chain(str(cert), str(key))
    elif user.get("client-certificate") and user.get("client-key"):
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
    elif user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    else:
        files.cleanup()
        return None
    files.cleanup()  # the chain is loaded
    return httpx.Client(base_url=server.url, verify=tls, headers=headers, timeout=10)


def _named(doc: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    for item in doc.get(key) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return dict(item.get(key[:-1]) or {})
    return {}
