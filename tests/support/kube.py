"""The one-node Kubernetes cluster made by scripts/kube, and a small client of
its API server for what a test checks on the cluster's side.

`scripts/kube up` starts the cluster (quick when it is up already) and prints
its JSON object; the test run stops it again only if it found none running,
when its last worker using it ends (tests/support/shared_use.py), unless
KUBE_KEEP=1. The client reads the admin kubeconfig `up` printed, as a
user's tools would.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.shared_use import shared_use
from tests.support.stack_config import proxy, squid, stack_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kube"
KUBE_MARK = "kubernetes"


def run_kube(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


class Api:
    """The API server as the kubeconfig's user (the cluster's admin)."""

    def __init__(self, kubeconfig: Path) -> None:
        doc = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])
        cluster = next(c for c in doc["clusters"] if c["name"] == context["context"]["cluster"])
        user = next(u for u in doc["users"] if u["name"] == context["context"]["user"])
        self.server = cluster["cluster"]["server"]
        self._files = tempfile.TemporaryDirectory(prefix="kube-client-")
        paths = {}
        for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
            source = cluster["cluster"] if key.startswith("certificate") else user["user"]
            path = Path(self._files.name) / key
            path.write_bytes(base64.b64decode(source[key]))
            paths[key] = str(path)
        tls = ssl.create_default_context(cafile=paths["certificate-authority-data"])
        tls.load_cert_chain(paths["client-certificate-data"], paths["client-key-data"])
        self.http = httpx.Client(base_url=self.server, verify=tls, timeout=30)

    def close(self) -> None:
        self.http.close()
        self._files.cleanup()

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at PATH, or None when there is none (404)."""
        answer = self.http.get(path)
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        return answer.json()  # type: ignore[no-any-return]

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        answer = self.http.get(path, params={"labelSelector": selector} if selector else None)
        answer.raise_for_status()
        return list(answer.json()["items"])

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.http.patch(
            path, content=json.dumps(body), headers={"Content-Type": "application/merge-patch+json"}
        )
        answer.raise_for_status()
        return answer.json()  # type: ignore[no-any-return]

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.http.post(path, json=body)
        answer.raise_for_status()
        return answer.json()  # type: ignore[no-any-return]

    def delete(self, path: str) -> None:
        answer = self.http.delete(path)
        if answer.status_code != 404:
            answer.raise_for_status()


@dataclass(frozen=True)
class Cluster:
    """What `scripts/kube up` printed."""

    kubeconfig: Path
    squid_image: str
    client_cidr: str
    host_address: str
    api: Api
    discovery_image: str = ""
    postgres_image: str = ""

    @classmethod
    def from_json(cls, line: str) -> Cluster:
        doc = json.loads(line)
        kubeconfig = Path(doc["kubeconfig"])
        return cls(
            kubeconfig,
            doc["squidImage"],
            doc["clientCidr"],
            doc["hostAddress"],
            Api(kubeconfig),
            doc["discoveryImage"],
            doc["postgresImage"],
        )


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[Cluster]:
    printed: list[str] = []

    def up() -> None:
        done = run_kube("up")
        if done.returncode != 0:
            raise AssertionError(f"scripts/kube up failed:\n{done.stderr[-6000:]}")
        printed.append(done.stdout.strip().splitlines()[-1])

    def down() -> None:
        done = run_kube("down", timeout=600)
        if done.returncode != 0:
            raise AssertionError(f"scripts/kube down failed:\n{done.stderr[-4000:]}")

    with shared_use(
        "kube",
        is_up=lambda: run_kube("status").returncode == 0,
        up=up,
        down=down,
        keep=os.environ.get("KUBE_KEEP") == "1",
    ):
        cluster = Cluster.from_json(printed[-1])
        try:
            yield cluster
        finally:
            cluster.api.close()


def kube_stack_config(
    cluster: Cluster,
    *,
    namespace: str,
    replicas: int,
    create_namespace: bool = True,
    provider: str = "cluster",
) -> dict[str, Any]:
    """A stack of squid pods on the cluster, reachable from this machine:
    the manifest names each Service by its cluster IP (kube-proxy routes it
    here), squid admits this machine's address to the pods, and the page the
    tests fetch is on this machine (a private address squid refuses by default)."""
    entry = {
        "name": provider,
        "type": "kubernetes",
        "kubernetes": {
            "kubeconfig": str(cluster.kubeconfig),
            "namespace": namespace,
            "createNamespace": create_namespace,
            "image": cluster.squid_image,
            "manifestAddress": "clusterIP",
            "clientNamespaces": ["crawlers"],
            "cpuRequest": "10m",
            "memoryRequest": "32Mi",
        },
    }
    block = squid(
        cluster.client_cidr,
        connect_ports=["443", "1024-65535"],
        blocked_destinations=[],
        username="crawler",
    )
    return stack_config([entry], [proxy("pods", provider, replicas=replicas)], block)
