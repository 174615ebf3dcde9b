"""A proxy from an image that ships neither squid nor the guest agent, as a
distribution's stock cloud image does, on a host whose VMs reach no Debian
mirror but the one the provider's `apt` setting names.

The bare variant of scripts/build-proxy-image and the signed repository of
scripts/build-apt-repo (squid, qemu-guest-agent and their dependencies) are
served from this machine on the testbed network. The real Pulumi CLI brings up
one proxy whose NIC is on the testbed's bridge itself, not its libvirt
network, as on a bridge with an outside DHCP server: the provider reads no
lease there and ARP fails on this kernel, so the address can only come from
the agent, which cloud-init's default vendor-data installs from that mirror.
Then squid, installed from the same mirror by the proxy's user-data, answers
a CONNECT through the VM, and the stack's manifest names that address.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from proxyinfra.names import proxy_id
from tests.support.http import FileServer
from tests.support.images import apt_repo, proxy_image
from tests.support.proxyvm import (
    PageServer,
    Stages,
    destroy_and_clean,
    guest_diagnostics,
    guest_run,
    proxy_vm_provider,
    wait_for_squid,
)
from tests.support.pulumi_cli import CliStack
from tests.support.squid import connect_status
from tests.support.stack_config import placement, proxy, set_kvm, squid, stack_config
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

USERNAME = "crawler"
PORT = 3128
# Boot, then apt from the mirror under TCG: the agent before the address,
# squid after it.
IP_TIMEOUT = 600
SQUID_TIMEOUT = 600.0


def fleet_config(
    testbed: Testbed, image_url: str, sha256: str, mirror: str, key: str
) -> dict[str, Any]:
    provider = set_kvm(
        proxy_vm_provider(testbed, image_url, sha256),
        bridge=testbed.bridge,  # DHCP from outside libvirt's view: no lease to read
        ip_timeout=IP_TIMEOUT,
        # The repository has one suite: the release itself.
        apt={"mirror": mirror, "suites": ["$RELEASE"], "key": key},
    )
    return stack_config(
        [provider],
        [proxy("stock", provider["name"], where=placement("small", "proxy"))],
        squid(
            str(testbed.subnet),
            connect_ports=["443", "1024-65535"],
            blocked_destinations=[],  # the page server is on the gateway, a private address
            username=USERNAME,
        ),
    )


def one_deb(pool: Path, package: str) -> str:
    found = sorted(pool.glob(f"{package}_*.deb"))
    assert len(found) == 1, found
    return found[0].name


# A hang guard: two image builds and the repository from nothing take about
# 5 min, the VM's first boot with its installs a few more (TCG).
@pytest.mark.timeout(2400)
def test_a_proxy_from_an_image_without_squid_or_agent_installs_both_from_the_named_mirror(
    testbed: Testbed, testbed_conn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = testbed_conn
    stages = Stages(capsys)
    image = proxy_image("bare")
    stages.add(f"bare image build ({'cached' if image.cached else 'built'})", image.seconds)
    shipped = image.path.with_name("debian-bare.packages").read_text().split()
    assert "squid" not in shipped and "qemu-guest-agent" not in shipped
    started = time.monotonic()
    repo = apt_repo()
    stages.add("package repository (scripts/build-apt-repo)", time.monotonic() - started)

    stack_name = f"stock{uuid.uuid4().hex[:6]}"
    pid = proxy_id("egress-proxies", stack_name, "stock-0")
    files = FileServer(str(testbed.gateway))
    digest = image.path.with_name(image.path.name + ".sha256").read_text().split()[0]
    provider_log = tmp_path / "provider.log"
    with files, PageServer(str(testbed.gateway)) as page:
        image_url = files.add("/debian-bare.qcow2", file=image.path)
        mirror = files.add_tree("/debian", repo)
        key = (repo / "key.asc").read_text()
        stack = CliStack(
            tmp_path / "project",
            stack_name,
            fleet_config(testbed, image_url, digest, mirror, key),
            extra_env={"EGRESS_PROXIES_LOG_FILE": str(provider_log)},
        )
        try:
            started = time.monotonic()
            up = stack.run("up", "--yes", "--skip-preview", timeout=1800)
            log = provider_log.read_text() if provider_log.exists() else ""
            assert up.returncode == 0, f"{up.stdout[-4000:]}\n{up.stderr[-2000:]}\n{log[-4000:]}"
            stages.add("pulumi up (the CLI)", time.monotonic() - started)

            # The address came from the agent cloud-init installed: the provider says so ...
            found = re.search(
                rf"name={pid} domain has address (\S+) from the guest agent after ([\d.]+)s", log
            )
            assert found is not None, log[-4000:]
            ip = found.group(1)
            stages.add("domain start to the agent's address", float(found.group(2)))
            # ... and libvirt's own client, as the testbed user, asks the agent too.
            listed = testbed.virsh("domifaddr", "--source", "agent", pid)
            assert listed.returncode == 0, listed.stderr
            assert re.search(rf"\s{re.escape(ip)}/\d+", listed.stdout), listed.stdout

            # Squid, installed after the agent by the proxy's own user-data.
            deadline = time.monotonic() + SQUID_TIMEOUT
            status = wait_for_squid(ip, PORT, page.target, deadline)
            dom = conn.lookupByName(pid)
            assert status == 407, f"squid answered {status}\n{guest_diagnostics(dom)}"
            stages.add("squid answering (since up)", time.monotonic() - started)
            fleet = stack.output("fleet")
            [entry] = fleet["proxies"]
            assert (entry["id"], entry["name"], entry["type"]) == (pid, "stock-0", "kvm")
            assert (entry["host"], entry["port"]) == (ip, PORT), "the manifest names the VM"
            password = entry["auth"]["password"]
            assert entry["auth"]["username"] == USERNAME and password
            assert connect_status(ip, PORT, page.target, (USERNAME, password)) == 200
            assert page.saw(ip), "the CONNECT went through the VM"
            status_text = guest_run(dom, "cloud-init", "status", "--long", "--wait", timeout=300)
            assert "status: done" in status_text, status_text

            # Both came from the named mirror, checked by its signature.
            assert files.count("/debian/dists/bookworm/InRelease") >= 1
            for package in ("squid", "qemu-guest-agent"):
                path = f"/debian/pool/{one_deb(repo / 'pool', package)}"
                assert files.count(path) == 1, f"{path} was not fetched from the mirror"
        finally:
            destroyed, left = destroy_and_clean(stack, conn, testbed, [pid], stages)
            stages.show(f"\nstock image, stack {stack_name}: stages\n{stages.table()}")
    assert not destroyed, destroyed
    assert left == [], "the destroy left these behind (removed now)"
