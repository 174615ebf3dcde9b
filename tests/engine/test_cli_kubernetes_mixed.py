"""One stack, two places: a proxy VM on the libvirt testbed and a squid pod on
the cluster of scripts/kube, brought up by one `pulumi up` of the real CLI,
listed in one manifest, probed by one discovery service and leased by kind
(the lease's provider selector), each fetching a page through its proxy."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxies_client import lease
from tests.support.discovery import ServiceProcess, all_healthy, api_client, free_port, wait_for
from tests.support.http import FileServer
from tests.support.images import proxy_image
from tests.support.kube import Cluster, kube_stack_config
from tests.support.proxyvm import PAGE, PageServer, proxy_vm_provider, self_signed
from tests.support.pulumi_cli import CliStack
from tests.support.stack_config import placement, proxy, squid
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli, pytest.mark.kubernetes]

TOKEN = "mixed-discovery-token-" + "9e8d7c6b" * 3
HEALTHY_TIMEOUT = 300.0  # the VM: cloud-init under TCG


def mixed_config(testbed: Testbed, cluster: Cluster, image_url: str, sha256: str) -> dict[str, Any]:
    kvm = proxy_vm_provider(testbed, image_url, sha256)
    config = kube_stack_config(cluster, namespace="ep-cli-mixed", replicas=1)
    config["providers"].insert(0, kvm)
    config["proxies"].insert(0, proxy("vm", kvm["name"], where=placement("small", "proxy")))
    # Both the VMs' network and this machine's address on the pods' bridge
    # (the cluster's squid block with its allowed clients replaced).
    config["squid"].update(squid(str(testbed.subnet), cluster.client_cidr))
    return config


@pytest.fixture
def tls(testbed: Testbed, tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(str(testbed.gateway), tmp_path)


@pytest.fixture
def page(testbed: Testbed, tls: tuple[Path, Path]) -> Iterator[PageServer]:
    # HTTPS (squid tunnels CONNECT to the configured ports) on the testbed
    # network's gateway: the VMs there have no other route (an isolated
    # network), and the pods reach it through their own gateway, this same
    # machine.
    with PageServer(str(testbed.gateway), tls=tls) as server:
        yield server


@pytest.mark.timeout(1800)
def test_one_up_one_manifest_both_kinds_leased(
    testbed: Testbed,
    kube_cluster: Cluster,
    page: PageServer,
    tls: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    verify = ssl.create_default_context(cafile=str(tls[0]))
    image = proxy_image()
    digest = image.path.with_name(image.path.name + ".sha256").read_text().split()[0]
    with FileServer() as files:
        url = files.add("/debian-proxy.qcow2", file=image.path)
        config = mixed_config(testbed, kube_cluster, url, digest)
        stack = CliStack(tmp_path / "project", "mixed", config, plugins=("kubernetes",))
        try:
            started = time.monotonic()
            stack.ok("up", "--yes", "--skip-preview")
            print(f"\nmixed stack (1 VM, 1 pod): up {time.monotonic() - started:.1f}s")
            fleet = stack.output("fleet")
            kinds = {p["name"]: (p["provider"], p["type"]) for p in fleet["proxies"]}
            assert kinds == {
                "vm-0": (config["providers"][0]["name"], "kvm"),
                "pods-0": ("cluster", "kubernetes"),
            }
            fleet_file = tmp_path / "fleet.json"
            fleet_file.write_text(stack.ok("stack", "output", "--json", "--show-secrets").stdout)
            args = ["--fleet", str(fleet_file), "--db", str(tmp_path / "leases.db")]
            args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-target", page.target]
            args += ["--probe-interval", "2"]
            service = ServiceProcess(
                args, log_path=tmp_path / "discovery.log", env={"DISCOVERY_TOKEN": TOKEN}
            ).start()
            try:
                with api_client(service.url, TOKEN) as client:
                    wait_for(
                        lambda: all_healthy(client, {"vm-0", "pods-0"}),
                        timeout=HEALTHY_TIMEOUT,
                        interval=1,
                    )
                for provider, name in (
                    (config["providers"][0]["name"], "vm-0"),
                    ("cluster", "pods-0"),
                ):
                    with lease(
                        service.url, f"c-{name}", provider=provider, token=TOKEN, wait=10
                    ) as held:
                        assert held.name == name
                        with httpx.Client(proxy=held.url, verify=verify, timeout=30) as http:
                            answer = http.get(page.url)
                        assert answer.status_code == 200 and answer.content == PAGE
            finally:
                service.stop()
        finally:
            if stack.resources():
                stack.ok("destroy", "--yes", "--skip-preview")
