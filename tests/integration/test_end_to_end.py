"""The whole product once, as an operator and a crawler meet it.

The proxy image of scripts/build-proxy-image served over HTTP; the real
Pulumi CLI (`pulumi up` of a stack of the project's program) brings up two
proxy VMs on the testbed, cloud-init configures squid from the seed ISO; the discovery
service runs on the exported manifest, its health engine CONNECTs through both
VMs; a crawler with `egress_proxies_client` leases one, fetches an HTTPS page
through it (the page server sees the VM's address), reports it blocked and
releases it; an immediate grant for that target is refused (409) while the
other VM is still leased; the stack is destroyed and the host holds no domain,
overlay or seed of it, only the cached base image.

Prints the time of each stage (run with -s to see them as they happen).
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxies_client import NoProxyAvailable, lease
from proxyinfra.names import base_volume, proxy_id
from tests.support.discovery import ServiceProcess, free_port, proxies, wait_for
from tests.support.http import FileServer
from tests.support.images import proxy_image
from tests.support.proxyvm import (
    PAGE,
    PageServer,
    Stages,
    destroy_and_clean,
    guest_diagnostics,
    guest_run,
    pool_volumes,
    proxy_vm_provider,
    self_signed,
    wait_for_squid,
)
from tests.support.pulumi_cli import CliStack
from tests.support.squid import connect_status
from tests.support.stack_config import placement, proxy, squid, stack_config
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

NAMES = ("edge-0", "edge-1")
USERNAME = "crawler"
TOKEN = "e2e-discovery-token-" + "5d1c0ffee" * 3
HEALTHY_TIMEOUT = 300.0  # from the addresses to both proxies healthy (cloud-init under TCG)
ELSEWHERE = "https://elsewhere.example/"


def fleet_config(testbed: Testbed, image_url: str, sha256: str) -> dict[str, Any]:
    provider = proxy_vm_provider(testbed, image_url, sha256)
    edge = proxy("edge", provider["name"], replicas=len(NAMES), where=placement("small", "proxy"))
    return stack_config(
        [provider],
        [edge],
        squid(
            str(testbed.subnet),
            connect_ports=["443", "1024-65535"],
            # The page server is on the gateway, a private address squid refuses by default.
            blocked_destinations=[],
            username=USERNAME,
        ),
    )


def discovery(tmp_path: Path, fleet: Path, probe_target: str, gateway: int) -> ServiceProcess:
    args = ["--fleet", str(fleet), "--db", str(tmp_path / "leases.db")]
    args += ["--gateway", f"127.0.0.1:{gateway}", "--gateway-idle", "1"]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-target", probe_target]
    args += ["--probe-interval", "2", "--lease-cooldown", "600", "--max-lease-ttl", "120"]
    env = {"DISCOVERY_TOKEN": TOKEN, "EGRESS_PROXIES_LOG": "info"}
    return ServiceProcess(args, log_path=tmp_path / "discovery.log", env=env)


def both_healthy(client: httpx.Client) -> bool:
    listed = proxies(client)
    return sorted(listed) == sorted(NAMES) and all(
        p["health"] == "healthy" for p in listed.values()
    )


# A hang guard: an image build from nothing takes about 4 min, the rest about 5 (TCG).
@pytest.mark.timeout(1800)
def test_a_crawler_fetches_a_page_through_a_proxy_vm_the_stack_made(
    testbed: Testbed, testbed_conn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = testbed_conn
    stages = Stages(capsys)
    image = proxy_image()
    stages.add(f"image build ({'cached' if image.cached else 'built'})", image.seconds)
    if not image.cached:
        stages.show(image.log)

    stack_name = f"e2e{uuid.uuid4().hex[:6]}"
    ids = [proxy_id("egress-proxies", stack_name, proxy) for proxy in NAMES]
    files = FileServer()
    digest = image.path.with_name(image.path.name + ".sha256").read_text().split()[0]
    config = fleet_config(testbed, files.add("/debian-proxy.qcow2", file=image.path), digest)
    # Where the provider's log goes under the CLI (docs/kvm-provider.md, "Logging").
    provider_log = tmp_path / "provider.log"
    stack = CliStack(
        tmp_path / "project",
        stack_name,
        config,
        extra_env={"EGRESS_PROXIES_LOG_FILE": str(provider_log)},
    )
    tls = self_signed(str(testbed.gateway), tmp_path)
    crawler_tls = ssl.create_default_context(cafile=str(tls[0]))
    service: ServiceProcess | None = None
    try:
        with files, PageServer(str(testbed.gateway), tls=tls) as page, ExitStack() as closing:
            # -- pulumi up ------------------------------------------------------------------
            started = time.monotonic()
            up = stack.run("up", "--yes", "--skip-preview", timeout=1200)
            up_done = time.monotonic()
            log = provider_log.read_text() if provider_log.exists() else ""
            assert up.returncode == 0, f"{up.stdout[-4000:]}\n{up.stderr[-2000:]}\n{log[-4000:]}"
            stages.add("pulumi up (the CLI), all resources", up_done - started)
            fetched = re.search(r"base image (fetched into host pool|cached) .* in ([\d.]+) s", log)
            assert fetched is not None, log[-4000:]
            how = "download" if fetched.group(1).startswith("fetched") else "cached, no download"
            stages.add(f"download into the pool ({how})", float(fetched.group(2)))
            address_lines = (
                r"name=(proxy-[0-9a-f]{10}) domain has address (\S+) from .+? after ([\d.]+)s"
            )
            booted = {pid: (ip, float(s)) for pid, ip, s in re.findall(address_lines, log)}
            assert sorted(booted) == sorted(ids), log[-4000:]
            boot = max(seconds for _, seconds in booted.values())
            stages.add("boot to IP (domain start to DHCP lease, slower VM)", boot)

            fleet = stack.output("fleet")
            by_name = {p["name"]: p for p in fleet["proxies"]}
            assert sorted(by_name) == sorted(NAMES)
            for name, pid in zip(NAMES, ids, strict=True):
                entry = by_name[name]
                assert entry["id"] == pid and entry["type"] == "kvm"
                assert entry["host"] == booted[pid][0], "the exported address is the VM's"
                assert entry["auth"]["username"] == USERNAME and entry["auth"]["password"]
            # As `pulumi stack output --json --show-secrets` writes it.
            fleet_file = tmp_path / "stack-output.json"
            fleet_file.write_text(json.dumps({"fleet": fleet}))

            # -- the discovery service and its health engine -------------------------------
            gateway_port = free_port()
            service = discovery(tmp_path, fleet_file, page.target, gateway_port).start()
            client = closing.enter_context(
                httpx.Client(
                    base_url=service.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
                )
            )
            try:
                wait_for(
                    lambda: both_healthy(client),
                    timeout=HEALTHY_TIMEOUT,
                    interval=1,
                )
            except AssertionError:
                raise AssertionError(
                    f"not both healthy {HEALTHY_TIMEOUT:.0f}s after the addresses: "
                    f"{proxies(client)}\n"
                    + "\n".join(guest_diagnostics(conn.lookupByName(pid)) for pid in ids)
                    + f"\n{service.log()[-3000:]}"
                ) from None
            healthy = time.monotonic()
            # The probes' CONNECTs really went through both VMs to the target.
            assert {ip for ip, _ in booted.values()} <= page.peers
            stages.add("first healthy probe of both (since up)", healthy - up_done)
            stages.add("  ... since domain start, slower VM", healthy - up_done + boot)

            for pid in ids:  # cloud-init finished, not just squid up
                status = guest_run(
                    conn.lookupByName(pid), "cloud-init", "status", "--long", "--wait", timeout=120
                )
                assert "status: done" in status, status
            ip, port = by_name[NAMES[0]]["host"], by_name[NAMES[0]]["port"]
            password = by_name[NAMES[0]]["auth"]["password"]
            assert connect_status(ip, port, page.target, (USERNAME, password + "x")) == 407
            assert connect_status(ip, port, page.target) == 407
            assert wait_for_squid(ip, port, page.target, time.monotonic() + 5) == 407

            # -- a crawler ----------------------------------------------------------------
            with ExitStack() as crawler_1:
                before = time.monotonic()
                first = crawler_1.enter_context(
                    lease(service.url, "crawler-1", target=page.url, token=TOKEN, wait=30)
                )
                stages.add("first lease", time.monotonic() - before)
                vm = by_name[first.name]["host"]
                with httpx.Client(proxy=first.url, verify=crawler_tls, timeout=30) as http:
                    answer = http.get(page.url)
                assert answer.status_code == 200 and answer.content == PAGE
                assert page.clients[-1] == vm, "the page server should see the VM's address"

                with lease(
                    service.url, "crawler-2", target=page.url, token=TOKEN, wait=30
                ) as second:
                    assert second.name != first.name
                    first.report("blocked")
                    crawler_1.close()  # crawler-1 releases its lease
                    # The same target, immediately: the blocked VM cools down, the other is leased.
                    with (
                        pytest.raises(NoProxyAvailable) as refused,
                        lease(service.url, "crawler-3", target=page.url, token=TOKEN, wait=0),
                    ):
                        pass
                    assert refused.value.status == 409
                    listed = proxies(client)
                    assert listed[second.name]["leased"] is True
                    assert listed[first.name]["leased"] is False
                    cooling = [c["target"] for c in listed[first.name]["cooldowns"]]
                    assert cooling == [str(testbed.gateway)]
                    # The cooldown is for that target only: elsewhere the blocked VM serves.
                    with lease(
                        service.url, "crawler-3", target=ELSEWHERE, token=TOKEN, wait=0
                    ) as other:
                        assert other.name == first.name
            # -- any client, through the gateway: curl, one proxy URL -----------------------
            gateway_url = f"http://curl-session-e2e:{TOKEN}@127.0.0.1:{gateway_port}"
            curl = subprocess.run(
                [
                    "curl",
                    "-sS",
                    "--fail",
                    "--cacert",
                    str(tls[0]),
                    "--max-time",
                    "60",
                    "-x",
                    gateway_url,
                    page.url,
                ],
                capture_output=True,
                timeout=90,
            )
            assert curl.returncode == 0, curl.stderr.decode(errors="replace")
            assert curl.stdout == PAGE
            assert page.clients[-1] in {ip for ip, _ in booted.values()}, "through a VM"
            # The VM blocked for this target above is cooling down: the other one served.
            assert page.clients[-1] == by_name[second.name]["host"]
            wait_for(  # --gateway-idle 1: the session's lease is given back
                lambda: not any(p["leased"] for p in proxies(client).values()),
                timeout=10,
                interval=0.2,
            )
            assert service.terminate() == 0
            service = None
    finally:
        if service is not None:
            service.stop()
        destroyed, left = destroy_and_clean(stack, conn, testbed, ids, stages)
        stages.show(f"\nend to end, stack {stack_name}: stages\n{stages.table()}")

    assert not destroyed, destroyed
    assert left == [], "the destroy left these behind (removed now)"
    base = base_volume("", digest, "qcow2")
    assert base in pool_volumes(conn, testbed), "the cached base image should stay"
