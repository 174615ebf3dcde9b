"""One real recycle of a proxy VM on the testbed, by the autopilot.

The real Pulumi CLI brings up a stack of one kvm proxy (the Debian proxy
image, TCG); the real discovery service reads the stack's output by itself
(`--stack`, `pulumi stack output` every few seconds) and probes the VM
through squid; three sites report it `blocked` through the lease API; then
`python -m proxyinfra autopilot --once` (the real command, Pulumi's
Automation API) recycles it. Afterwards: the new generation's domain holds
another DHCP lease of the testbed's network (a new MAC, so a new address),
squid on it answers a CONNECT with the manifest's new credentials and
refuses one without, the old domain and its volumes are gone from the host,
the manifest and the service hold neither the old name nor the old address,
and the service reports the new proxy healthy.

One replica (`healthyFloor: 0`, so that recycling the group's only proxy is
allowed): two Debian boots in all, the old VM and its replacement. Prints
each part of the time from the autopilot's start to the first healthy probe
of the replacement (docs/autopilot.md, "Recycle to healthy on the testbed");
no part of it is asserted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxyinfra.names import proxy_id
from tests.support import ROOT
from tests.support.discovery import ServiceProcess, api_client, free_port, proxies, wait_for
from tests.support.http import FileServer
from tests.support.images import proxy_image
from tests.support.proxyvm import (
    PageServer,
    Stages,
    destroy_and_clean,
    leftovers,
    proxy_vm_provider,
)
from tests.support.pulumi_cli import PROJECT, CliStack
from tests.support.squid import connect_status, proxy_connect
from tests.support.stack_config import placement, proxy, squid, stack_config
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

SLOT, NEW = "edge-0", "edge-0-g2"  # the replica, and its name at generation 2
USERNAME = "crawler"
TOKEN = "autopilot-testbed-token-" + "7e57" * 4
WINDOW_S = 30
SITES = ("site-1.example", "site-2.example", "site-3.example")
POLICY = {
    # One replica: a floor of 0 lets the group's only proxy be recycled.
    "recycle": {"bannedSites": len(SITES), "window": f"{WINDOW_S}s", "healthyFloor": 0},
    "maxChangesPerRound": 1,
}
STACK_REFRESH_S = 10  # the service's `pulumi stack output` period (default 60)
HEALTHY_TIMEOUT = 300.0  # a Debian guest under TCG: DHCP at ~35 s, squid at ~60 s
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # proxyinfra/logs.py's asctime (local time)


def fleet_config(testbed: Testbed, image_url: str, sha256: str) -> dict[str, Any]:
    provider = proxy_vm_provider(testbed, image_url, sha256)
    edge = proxy("edge", provider["name"], replicas=1, where=placement("small", "proxy"))
    config = stack_config(
        [provider],
        [edge],
        squid(
            str(testbed.subnet),
            connect_ports=["443", "1024-65535"],
            # The probe target is on the gateway, a private address squid refuses by default.
            blocked_destinations=[],
            username=USERNAME,
        ),
    )
    config["autopilot"] = POLICY
    return config


def discovery(stack: CliStack, directory: Path, probe_target: str) -> ServiceProcess:
    """The service on STACK's output (`--stack`: it runs `pulumi stack output`
    itself), beside the project as an operator runs it, probing every 2 s."""
    args = ["--stack", stack.stack, "--db", str(directory / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-target", probe_target]
    args += ["--probe-interval", "2", "--lease-cooldown", "600"]
    refresh = {"DISCOVERY_STACK_REFRESH_SECONDS": str(STACK_REFRESH_S)}
    return ServiceProcess(
        args,
        log_path=directory / "discovery.log",
        env=stack.env() | refresh | {"DISCOVERY_TOKEN": TOKEN},
        cwd=stack.directory,
    )


@dataclass
class Timeline:
    """Wall-clock times (seconds since the epoch) of the recycle's parts, as
    the test, the provider's log and the decision log saw them."""

    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, what: str, at: float | None = None) -> None:
        self.marks.setdefault(what, time.time() if at is None else at)

    def table(self, since: str) -> str:
        zero = self.marks[since]
        rows = sorted(self.marks.items(), key=lambda item: item[1])
        return "\n".join(f"  {at - zero:7.1f}s  {what}" for what, at in rows)


def provider_marks(log: str, pid: str) -> dict[str, tuple[float, str]]:
    """The provider's lines about domain PID: when it was started and when it
    had its address (and which), from the log's own timestamps."""
    found: dict[str, tuple[float, str]] = {}
    for line in log.splitlines():
        if f"name={pid} " not in line:
            continue
        at = datetime.strptime(line[:23], LOG_TIME).timestamp()
        if "domain started;" in line:
            found.setdefault("started", (at, ""))
        elif address := re.search(r"domain has address (\S+) from", line):
            found.setdefault("address", (at, address.group(1)))
    return found


def report_blocked(http: httpx.Client, name: str) -> None:
    """Each site reports proxy NAME blocked, each on a lease of its own."""
    for site in SITES:
        granted = http.post("/v1/leases", json={"holder": "crawler"})
        assert granted.status_code == 201, granted.text
        lease = granted.json()
        assert lease["proxy"]["name"] == name
        reported = http.post(
            f"/v1/leases/{lease['id']}/report", json={"outcome": "blocked", "target": site}
        )
        assert reported.status_code == 204, reported.text
        assert http.delete(f"/v1/leases/{lease['id']}").status_code == 204


def older_than_the_window(stack: CliStack, name: str) -> None:
    """Waits until replica NAME was made more than the window ago (the
    planner holds a generation younger than its window)."""
    [made] = [
        r["created"]
        for r in stack.resources()
        if r["type"] == "egress-proxies:fleet:Proxy" and r["urn"].endswith(f"::{name}")
    ]
    age = time.time() - datetime.fromisoformat(made).timestamp()
    time.sleep(max(0.0, WINDOW_S + 1 - age))


def mac_of(conn: Any, pid: str) -> str:
    xml: str = conn.lookupByName(pid).XMLDesc(0)
    return xml.split("<mac address='", 1)[1].split("'", 1)[0]


# A hang guard: two Debian guests under TCG and three Pulumi updates take about 5 minutes.
@pytest.mark.timeout(1200)
def test_the_autopilot_recycles_a_blocked_vm_to_a_new_address_that_serves(
    testbed: Testbed, testbed_conn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = testbed_conn
    stages = Stages(capsys)
    image = proxy_image()
    digest = image.path.with_name(image.path.name + ".sha256").read_text().split()[0]
    stack_name = f"ap{uuid.uuid4().hex[:6]}"
    old_id, new_id = (proxy_id(PROJECT, stack_name, n) for n in (SLOT, NEW))
    provider_log = tmp_path / "provider.log"
    files = FileServer()
    stack = CliStack(
        tmp_path / "project",
        stack_name,
        fleet_config(testbed, files.add("/debian-proxy.qcow2", file=image.path), digest),
        extra_env={"EGRESS_PROXIES_LOG_FILE": str(provider_log)},
    )
    timeline = Timeline()
    try:
        with files, PageServer(str(testbed.gateway)) as page, ExitStack() as closing:
            # -- the stack, and the service reading it ------------------------------------
            started = time.monotonic()
            up = stack.run("up", "--yes", "--skip-preview", timeout=900)
            assert up.returncode == 0, f"{up.stdout[-4000:]}\n{up.stderr[-2000:]}"
            stages.add("pulumi up, one proxy VM", time.monotonic() - started)
            [old] = stack.output("fleet")["proxies"]
            assert (old["name"], old["id"]) == (SLOT, old_id)
            old_mac = mac_of(conn, old_id)
            service = discovery(stack, tmp_path, page.target).start()
            closing.callback(service.stop)
            http = closing.enter_context(api_client(service.url, TOKEN))

            def healthy(name: str) -> bool:
                listed = proxies(http)
                return list(listed) == [name] and listed[name]["health"] == "healthy"

            try:
                wait_for(lambda: healthy(SLOT), timeout=HEALTHY_TIMEOUT, interval=1)
            except AssertionError:
                raise AssertionError(f"{proxies(http)}\n{service.log()[-3000:]}") from None
            stages.add("old proxy healthy (since up)", time.monotonic() - started)

            # -- blocked by three sites; one round of the autopilot ----------------------
            older_than_the_window(stack, SLOT)
            report_blocked(http, SLOT)
            decisions = tmp_path / "decisions.jsonl"
            command = [sys.executable, "-m", "proxyinfra", "--project-dir", str(stack.directory)]
            command += ["autopilot", "--once", "--stack", stack_name]
            command += ["--discovery", service.url, "--log", str(decisions)]
            output = (tmp_path / "autopilot.out").open("w")
            closing.callback(output.close)
            timeline.mark("autopilot started")
            pilot = subprocess.Popen(
                command,
                cwd=ROOT,
                env=stack.env() | {"DISCOVERY_TOKEN": TOKEN},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            closing.callback(_ended, pilot)
            new_ip = watch(
                pilot,
                provider_log,
                (old_id, new_id),
                (old["port"], page.target),
                http,
                conn,
                timeline,
            )
            assert pilot.wait(timeout=600) == 0, (tmp_path / "autopilot.out").read_text()[-4000:]

            # -- the decision, as the log wrote it ---------------------------------------
            lines = [json.loads(line) for line in decisions.read_text().splitlines()]
            [change] = [d for d in lines if d["event"] == "change"]
            assert change["result"] == "applied", change
            assert (change["kind"], change["rule"]) == ("recycle", "bannedSites")
            assert change["proxies"] == [SLOT, NEW]
            assert change["signal"]["blockedSites"] == len(SITES)
            update_start = datetime.fromisoformat(change["updateStart"]).timestamp()
            timeline.mark("Pulumi update started (updateStart)", update_start)
            timeline.mark(
                "Pulumi update ended (autopilot: updateStart + duration)",
                update_start + change["duration"],
            )
            timeline.mark("decision logged (change line)", _ts(change["ts"]))
            [round_] = [d for d in lines if d["event"] == "round"]
            timeline.mark("round logged, autopilot exits", _ts(round_["ts"]))

            # -- a new address from DHCP, squid on it with the manifest's credentials -----
            fleet = stack.output("fleet")
            [new] = fleet["proxies"]
            assert (new["name"], new["id"], new["host"]) == (NEW, new_id, new_ip)
            assert new_ip != old["host"], "the replacement must have a new address"
            new_mac = mac_of(conn, new_id)
            assert new_mac != old_mac
            leases = conn.networkLookupByName(testbed.network).DHCPLeases()
            assert {"ipaddr": new_ip, "mac": new_mac} in [
                {"ipaddr": lease["ipaddr"], "mac": lease["mac"]} for lease in leases
            ], "the new address is the testbed DHCP server's lease for the new MAC"
            password = new["auth"]["password"]
            assert new["auth"]["username"] == USERNAME and password != old["auth"]["password"]
            credentials = (USERNAME, password)
            assert connect_status(new_ip, new["port"], page.target, credentials) == 200
            assert page.saw(new_ip), "the CONNECT went through the new VM to the target"
            assert connect_status(new_ip, new["port"], page.target) == 407
            assert (
                connect_status(new_ip, new["port"], page.target, (USERNAME, "x" + password)) == 407
            )

            # -- the old one gone: host, manifest, service --------------------------------
            assert leftovers(conn, testbed, [old_id]) == [], "the old domain and volumes go"
            assert [(p["name"], p["id"], p["host"]) for p in fleet["proxies"]] == [
                (NEW, new_id, new_ip)
            ], "neither the old name nor the old address is in the fleet"
            assert healthy(NEW), proxies(http)
            [last] = json.loads(stack.ok("stack", "history", "--json").stdout)[:1]
            assert last["message"] == change["message"]
    finally:
        destroyed, left = destroy_and_clean(stack, conn, testbed, [old_id, new_id], stages)
        if timeline.marks:
            stages.show(
                f"\nrecycle on the testbed, stack {stack_name}:\n{timeline.table('autopilot started')}"
            )
        stages.show(f"stages\n{stages.table()}")
    assert not destroyed, destroyed
    assert left == [], "the destroy left these behind (removed now)"


def _ended(process: subprocess.Popen[bytes]) -> None:
    """Kills PROCESS if it still runs (a failed test must leave no autopilot)."""
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


EXITED = "autopilot exited"
SQUID = "squid answers on the new address (407 without credentials)"
HEALTHY = "service: the new proxy healthy (first healthy probe seen)"


def watch(
    pilot: subprocess.Popen[bytes],
    provider_log: Path,
    ids: tuple[str, str],
    squid_at: tuple[int, str],
    http: httpx.Client,
    conn: Any,
    timeline: Timeline,
) -> str:
    """Follows the recycle as it happens (every half second) until the
    autopilot has exited, squid answers on the new address and the service
    reports the new proxy healthy, marking each part in TIMELINE. IDS: the
    old and the new domain; SQUID_AT: squid's port and a CONNECT target.
    Returns the new address."""
    old_id, new_id = ids
    port, target = squid_at
    deadline = time.monotonic() + 900
    new_ip = ""
    while time.monotonic() < deadline:
        if pilot.poll() is not None:
            if pilot.returncode != 0:
                return new_ip  # the caller shows the autopilot's output
            timeline.mark(EXITED)
        marks = provider_marks(provider_log.read_text() if provider_log.exists() else "", new_id)
        if "started" in marks:
            timeline.mark("new domain started (provider log)", marks["started"][0])
        if "address" in marks:
            at, new_ip = marks["address"]
            timeline.mark("new domain has its DHCP lease (provider log)", at)
        if old_id not in {d.name() for d in conn.listAllDomains(0)}:
            timeline.mark("old domain gone from the host")
        if new_ip and SQUID not in timeline.marks:
            try:
                status, _, sock = proxy_connect(new_ip, port, target, timeout=2)
                sock.close()
                if status == 407:
                    timeline.mark(SQUID)
            except OSError:
                pass  # squid not listening yet
        listed = proxies(http)
        if NEW in listed:
            timeline.mark("service lists the new proxy (its stack output read)")
            if listed[NEW]["health"] == "healthy":
                timeline.mark(HEALTHY)
        if all(m in timeline.marks for m in (EXITED, SQUID, HEALTHY)):
            return new_ip
        time.sleep(0.5)
    raise AssertionError(f"the recycle did not end within 900 s: {timeline.marks}")
