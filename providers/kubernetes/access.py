"""Can the stack reach its cluster? The kubeconfig a provider entry names (or
the ambient one), its context, and a TCP connect to that context's API server,
checked before any resource is registered: pulumi-kubernetes itself previews
against an unreachable cluster with a warning and fails only in `up`, and a
missing context surfaces from inside the provider plugin."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from providers.kubernetes.config import KubernetesProvider
from proxyinfra.config import resolve_path

CONNECT_TIMEOUT = 5.0  # seconds: an address that drops packets must not hang preview


class AccessError(Exception):
    """What is wrong, in words that name the file, context or address."""


@dataclass(frozen=True)
class ApiServer:
    url: str
    context: str
    source: str  # the kubeconfig file(s) it came from

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        if not parts.hostname:
            raise AccessError(f"context {self.context!r} of {self.source}: bad server {self.url!r}")
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _files(config: KubernetesProvider, base_dir: Path, env: Mapping[str, str]) -> list[Path]:
    if config.kubeconfig:
        return [resolve_path(config.kubeconfig, base_dir)]
    if env.get("KUBECONFIG"):
        return [Path(p).expanduser() for p in env["KUBECONFIG"].split(os.pathsep) if p]
    return [Path(env.get("HOME", str(Path.home()))) / ".kube" / "config"]


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise AccessError(f"kubeconfig {path} does not exist") from None
    except (OSError, yaml.YAMLError) as error:
        raise AccessError(f"kubeconfig {path} cannot be read: {error}") from None
    if not isinstance(doc, dict):
        raise AccessError(f"kubeconfig {path} is not a kubeconfig (no mapping)")
    return doc


def _named(docs: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    # As kubectl merges KUBECONFIG: the first file that names an entry wins.
    found: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for item in doc.get(key) or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                found.setdefault(item["name"], item.get(key[:-1]) or {})
    return found


def api_server(
    config: KubernetesProvider, base_dir: Path, env: Mapping[str, str] = os.environ
) -> ApiServer:
    files = _files(config, base_dir, env)
    existing = [f for f in files if f.exists()]
    source = ":".join(str(f) for f in files)
    if not existing:
        raise AccessError(f"kubeconfig {source} does not exist")
    docs = [_load(f) for f in existing]
    current = next((d["current-context"] for d in docs if d.get("current-context")), None)
    name = config.context or current
    contexts = _named(docs, "contexts")
    if not name:
        raise AccessError(f"kubeconfig {source} selects no context; set kubernetes.context")
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise AccessError(f"context {name!r} is not in kubeconfig {source} (contexts: {known})")
    cluster = _named(docs, "clusters").get(str(contexts[name].get("cluster")))
    url = cluster.get("server") if cluster else None
    if not isinstance(url, str) or not url:
        raise AccessError(f"context {name!r} of kubeconfig {source} names no cluster server")
    return ApiServer(url, name, source)


Connect = Callable[[tuple[str, int], float], socket.socket]


def check_reachable(
    server: ApiServer, connect: Connect = socket.create_connection, timeout: float = CONNECT_TIMEOUT
) -> None:
    try:
        connect(server.address, timeout).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise AccessError(
            f"cannot reach the Kubernetes API server {server.url} (context {server.context!r} "
            f"of kubeconfig {server.source}): {reason}"
        ) from None


def access_problem(config: KubernetesProvider, base_dir: Path) -> str | None:
    try:
        check_reachable(api_server(config, base_dir))
    except AccessError as error:
        return str(error)
    return None
