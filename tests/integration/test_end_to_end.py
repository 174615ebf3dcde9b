"""The whole product once, as an operator and a crawler meet it.

The proxy image of scripts/build-proxy-image served over HTTP; the real Pulumi
CLI (`pulumi up` of a stack of the project's program) brings up two proxy VMs
on the testbed, cloud-init configures squid from the seed ISO; the discovery
service reads the stack's exported manifest itself (`--stack`, every 10 s), its
health engine CONNECTs through both VMs; a crawler with `egress_proxies_client`
leases one, fetches an HTTPS page through it (the page server sees the VM's
address), reports it blocked and releases it; an immediate grant for that
target is refused (409) while the other VM is still leased; curl fetches the
page through the service's gateway.

Then, on the same stack, one real recycle by the autopilot: three sites report
the other VM blocked, `python -m proxyinfra autopilot --once` replaces it; its
new generation takes another DHCP lease (a new MAC), squid there admits the
manifest's new credentials only, the old domain and volumes and the old name
and address leave host, manifest and service, the group's other VM stays as
it was, and the service reports the new proxy healthy
(docs/autopilot.md, "Recycle to healthy on the testbed").

Then new squid settings (`connectPorts` narrowed) by `pulumi up`: each VM's
squid takes them in place through the guest agent, refusing the page
server's port from then on, with no restart and no reboot (the same libvirt
domain id and kernel boot id) and the manifest unchanged
(docs/kvm-provider.md, "New squid settings: in place").

Last, the stack is destroyed and the host holds no domain, overlay or seed of
it, only the cached base image.

Prints the time of each stage, and of each part of the recycle (run with -s to
see them as they happen); none is asserted.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
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
    leftovers,
    pool_volumes,
    proxy_vm_provider,
    self_signed,
    wait_for_squid,
)
from tests.support.pulumi_cli import PROJECT, CliStack
from tests.support.recycle import (
    HEALTHY,
    STARTED,
    Timeline,
    Watched,
    mac_of,
    older_than,
    report_blocked,
    start_autopilot,
    ts,
    watch,
)
from tests.support.squid import connect_status
from tests.support.stack_config import ALL_AT_ONCE, placement, proxy, squid, stack_config
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

NAMES = ("edge-0", "edge-1")
USERNAME = "crawler"
TOKEN = "e2e-discovery-token-" + "5d1c0ffee" * 3
HEALTHY_TIMEOUT = 300.0  # from the addresses to both proxies healthy (cloud-init under TCG)
ELSEWHERE = "https://elsewhere.example/"
WINDOW_S = 30
SITES = ("site-1.example", "site-2.example", "site-3.example")
POLICY = {
    "recycle": {"bannedSites": len(SITES), "window": f"{WINDOW_S}s", "healthyFloor": 1},
    "maxChangesPerRound": 1,
}
# The service's `pulumi stack output` period (default 60): it sees the recycle's manifest soon.
STACK_REFRESH_S = 10


def fleet_config(testbed: Testbed, image_url: str, sha256: str) -> dict[str, Any]:
    provider = proxy_vm_provider(testbed, image_url, sha256)
    edge = proxy(
        "edge",
        provider["name"],
        replicas=len(NAMES),
        where=placement("small", "proxy"),
        max_unavailable=ALL_AT_ONCE,
    )
    config = stack_config(
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
    config["autopilot"] = POLICY
    return config


def discovery(tmp_path: Path, stack: CliStack, probe_target: str, gateway: int) -> ServiceProcess:
    """The service on STACK's output (`--stack`: it runs `pulumi stack output`
    itself, in the project), as an operator runs it, probing every 2 s."""
    args = ["--stack", stack.stack, "--db", str(tmp_path / "leases.db")]
    args += ["--gateway", f"127.0.0.1:{gateway}", "--gateway-idle", "1"]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-target", probe_target]
    args += ["--probe-interval", "2", "--lease-cooldown", "600", "--max-lease-ttl", "120"]
    env = {"DISCOVERY_TOKEN": TOKEN, "EGRESS_PROXIES_LOG": "info"}
    env |= {"DISCOVERY_STACK_REFRESH_SECONDS": str(STACK_REFRESH_S)}
    return ServiceProcess(
        args, log_path=tmp_path / "discovery.log", env=stack.env() | env, cwd=stack.directory
    )


def both_healthy(client: httpx.Client) -> bool:
    listed = proxies(client)
    return sorted(listed) == sorted(NAMES) and all(
        p["health"] == "healthy" for p in listed.values()
    )


# A hang guard: an image build from nothing takes about 4 min, the rest about 7 (TCG).
@pytest.mark.timeout(2400)
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
    ids = [proxy_id(PROJECT, stack_name, proxy) for proxy in NAMES]
    # The recycle's new generation (of either replica): the destroy's leftovers check.
    all_ids = ids + [proxy_id(PROJECT, stack_name, f"{proxy}-g2") for proxy in NAMES]
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
    timeline = Timeline()
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
            # -- the discovery service and its health engine -------------------------------
            gateway_port = free_port()
            service = discovery(tmp_path, stack, page.target, gateway_port).start()
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

            # -- one recycle by the autopilot, of the VM nobody reported ------------------
            recycle(
                Recycling(stack, conn, testbed, service.url, client, page, tmp_path),
                by_name[second.name],
                by_name[first.name],
                provider_log,
                timeline,
            )
            marks = timeline.marks
            stages.add(
                "recycle: autopilot start to new proxy healthy", marks[HEALTHY] - marks[STARTED]
            )
            # -- new squid settings: in place, through the guest agent ----------------------
            squid_in_place(stack, conn, page, stages)
            assert service.terminate() == 0
            service = None
    finally:
        if service is not None:
            service.stop()
        destroyed, left = destroy_and_clean(stack, conn, testbed, all_ids, stages)
        if timeline.marks:
            stages.show(f"\nrecycle, stack {stack_name}:\n{timeline.table(STARTED)}")
        stages.show(f"\nend to end, stack {stack_name}: stages\n{stages.table()}")

    assert not destroyed, destroyed
    assert left == [], "the destroy left these behind (removed now)"
    base = base_volume("", digest, "qcow2")
    assert base in pool_volumes(conn, testbed), "the cached base image should stay"


def squid_in_place(stack: CliStack, conn: Any, page: PageServer, stages: Stages) -> None:
    """connectPorts narrowed to 443 by `pulumi up`: each VM's squid refuses
    the page server's port from then on, and no VM was restarted or booted
    again (the same libvirt domain id, the same kernel boot id): the new
    squid.conf went in through the guest agent (docs/kvm-provider.md)."""
    fleet = stack.output("fleet")
    domains = {p["id"]: conn.lookupByName(p["id"]) for p in fleet["proxies"]}

    def running() -> dict[str, tuple[int, str]]:
        return {
            pid: (dom.ID(), guest_run(dom, "cat", "/proc/sys/kernel/random/boot_id").strip())
            for pid, dom in domains.items()
        }

    def statuses() -> list[int]:
        return [
            connect_status(p["host"], p["port"], page.target, (USERNAME, p["auth"]["password"]))
            for p in fleet["proxies"]
        ]

    before = running()
    assert statuses() == [200] * len(domains)
    config = stack.read_config()  # the recycle's generation with it
    stack.write_config({**config, "squid": {**config["squid"], "connectPorts": ["443"]}})
    preview = stack.ok("preview")
    assert "replace" not in preview.stdout and "delete" not in preview.stdout, preview.stdout
    started = time.monotonic()
    stack.ok("up", "--yes", "--skip-preview")
    stages.add("squid settings in place (pulumi up)", time.monotonic() - started)
    assert statuses() == [403] * len(domains)
    assert running() == before
    assert stack.output("fleet") == fleet


@dataclass(frozen=True)
class Recycling:
    """What the recycle runs on: the stack that is up, the host, the service
    reading it (its URL and a client with its token), the page server."""

    stack: CliStack
    conn: Any
    testbed: Testbed
    service_url: str
    client: httpx.Client
    page: PageServer
    directory: Path


def recycle(
    on: Recycling,
    old: dict[str, Any],
    kept: dict[str, Any],
    provider_log: Path,
    timeline: Timeline,
) -> None:
    """Three sites report proxy OLD (a manifest entry) blocked; one round of
    the autopilot replaces it by its next generation, and the facts of
    docs/autopilot.md's "Recycle to healthy on the testbed" hold. KEPT, the
    group's other proxy, stays as it was."""
    stack, conn, http, page = on.stack, on.conn, on.client, on.page
    new_name = f"{old['name']}-g2"
    new_id = proxy_id(PROJECT, stack.stack, new_name)
    old_mac = mac_of(conn, old["id"])
    older_than(stack, old["name"], WINDOW_S)
    report_blocked(http, old["name"], SITES)

    timeline.mark(STARTED)
    with ExitStack() as closing:
        pilot, decisions, out = start_autopilot(stack, on.service_url, TOKEN, on.directory, closing)
        watched = Watched(old["id"], new_id, new_name, old["port"], page.target)
        new_ip = watch(pilot, provider_log, watched, http, conn, timeline)
        assert pilot.wait(timeout=600) == 0, out.read_text()[-4000:]

    # -- the decision, as the log wrote it -----------------------------------------------
    lines = [json.loads(line) for line in decisions.read_text().splitlines()]
    [change] = [d for d in lines if d["event"] == "change"]
    assert change["result"] == "applied", change
    assert (change["kind"], change["rule"]) == ("recycle", "bannedSites")
    assert change["proxies"] == [old["name"], new_name]
    assert change["signal"]["blockedSites"] == len(SITES)
    update_start = ts(change["updateStart"])
    timeline.mark("Pulumi update started (updateStart)", update_start)
    timeline.mark(
        "Pulumi update ended (autopilot: updateStart + duration)",
        update_start + change["duration"],
    )
    timeline.mark("decision logged (change line)", ts(change["ts"]))
    [round_] = [d for d in lines if d["event"] == "round"]
    timeline.mark("round logged, autopilot exits", ts(round_["ts"]))

    # -- a new address from DHCP, squid on it with the manifest's credentials -----------
    by_name = {p["name"]: p for p in stack.output("fleet")["proxies"]}
    new = by_name[new_name]
    assert (new["id"], new["host"]) == (new_id, new_ip)
    assert new_ip != old["host"], "the replacement must have a new address"
    new_mac = mac_of(conn, new_id)
    assert new_mac != old_mac
    leases = conn.networkLookupByName(on.testbed.network).DHCPLeases()
    assert {"ipaddr": new_ip, "mac": new_mac} in [
        {"ipaddr": lease["ipaddr"], "mac": lease["mac"]} for lease in leases
    ], "the new address is the testbed DHCP server's lease for the new MAC"
    password = new["auth"]["password"]
    assert new["auth"]["username"] == USERNAME and password != old["auth"]["password"]
    assert connect_status(new_ip, new["port"], page.target, (USERNAME, password)) == 200
    assert page.saw(new_ip), "the CONNECT went through the new VM to the target"
    assert connect_status(new_ip, new["port"], page.target) == 407
    assert connect_status(new_ip, new["port"], page.target, (USERNAME, "x" + password)) == 407

    # -- the old one gone: host, manifest, service; the other one untouched -------------
    assert leftovers(conn, on.testbed, [old["id"]]) == [], "the old domain and volumes go"
    assert {(p["name"], p["host"]) for p in by_name.values()} == {
        (new_name, new_ip),
        (kept["name"], kept["host"]),
    }, "neither the old name nor the old address is in the fleet"
    assert by_name[kept["name"]] == kept, "the group's other proxy is not touched"
    listed = proxies(http)
    assert sorted(listed) == sorted([new_name, kept["name"]]), listed
    assert listed[new_name]["health"] == "healthy", listed
    [last] = json.loads(stack.ok("stack", "history", "--json").stdout)[:1]
    assert last["message"] == change["message"]
