"""One recycle by the autopilot, followed as it happens on the testbed: the
blocked reports that trigger it, the run of `python -m proxyinfra autopilot
--once` beside a polling loop that times each part (provider log, libvirt,
squid, the discovery service), and the facts read afterwards. Used by
tests/integration/test_end_to_end.py, which recycles one proxy of the stack
it brought up (docs/autopilot.md, "Recycle to healthy on the testbed").

Nothing here asserts a time: the parts are printed, never checked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.support import ROOT
from tests.support.discovery import proxies
from tests.support.pulumi_cli import CliStack
from tests.support.squid import proxy_connect

LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # proxyinfra/logs.py's asctime (local time)
RECYCLE_TIMEOUT_S = 900.0  # the autopilot's exit, squid and a healthy probe, at the latest


@dataclass
class Timeline:
    """Wall-clock times (seconds since the epoch) of the recycle's parts, as
    the test, the provider's log and the decision log saw them; the first
    sighting of each part wins (the loop sees a state again and again)."""

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


def report_blocked(http: httpx.Client, name: str, sites: tuple[str, ...]) -> None:
    """Each of SITES reports proxy NAME blocked, each on a lease of its own.
    The service picks the proxy of a grant: a lease on another one is held
    (so that the next grant goes elsewhere) and given back after the report."""
    for site in sites:
        held: list[str] = []
        while True:
            granted = http.post("/v1/leases", json={"holder": f"crawler-{len(held)}"})
            assert granted.status_code == 201, (granted.text, held)
            lease = granted.json()
            if lease["proxy"]["name"] == name:
                break
            held.append(lease["id"])
        reported = http.post(
            f"/v1/leases/{lease['id']}/report", json={"outcome": "blocked", "target": site}
        )
        assert reported.status_code == 204, reported.text
        for lease_id in [lease["id"], *held]:
            assert http.delete(f"/v1/leases/{lease_id}").status_code == 204


def older_than(stack: CliStack, name: str, window_s: float) -> None:
    """Waits until replica NAME was made more than WINDOW_S ago (the planner
    holds a generation younger than its window)."""
    [made] = [
        r["created"]
        for r in stack.resources()
        if r["type"] == "egress-proxies:fleet:Proxy" and r["urn"].endswith(f"::{name}")
    ]
    age = time.time() - datetime.fromisoformat(made).timestamp()
    time.sleep(max(0.0, window_s + 1 - age))


def mac_of(conn: Any, pid: str) -> str:
    xml: str = conn.lookupByName(pid).XMLDesc(0)
    return xml.split("<mac address='", 1)[1].split("'", 1)[0]


def start_autopilot(
    stack: CliStack, service_url: str, token: str, directory: Path, closing: ExitStack
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """`python -m proxyinfra autopilot --once` on STACK, as an operator runs
    it; killed by CLOSING if it still runs. Returns the process, its decision
    log and its output file."""
    decisions, out = directory / "decisions.jsonl", directory / "autopilot.out"
    command = [sys.executable, "-m", "proxyinfra", "--project-dir", str(stack.directory)]
    command += ["autopilot", "--once", "--stack", stack.stack]
    command += ["--discovery", service_url, "--log", str(decisions)]
    output = closing.enter_context(out.open("w"))
    pilot = subprocess.Popen(
        command,
        cwd=ROOT,
        env=stack.env() | {"DISCOVERY_TOKEN": token},
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    closing.callback(_ended, pilot)
    return pilot, decisions, out


def _ended(process: subprocess.Popen[bytes]) -> None:
    """Kills PROCESS if it still runs (a failed test must leave no autopilot)."""
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


STARTED = "autopilot started"
EXITED = "autopilot exited"
SQUID = "squid answers on the new address (407 without credentials)"
HEALTHY = "service: the new proxy healthy (first healthy probe seen)"


@dataclass(frozen=True)
class Watched:
    """What `watch` follows: the old and the new domain and replica name,
    squid's port and a CONNECT target."""

    old_id: str
    new_id: str
    new_name: str
    port: int
    target: str


def watch(
    pilot: subprocess.Popen[bytes],
    provider_log: Path,
    watched: Watched,
    http: httpx.Client,
    conn: Any,
    timeline: Timeline,
) -> str:
    """Follows the recycle as it happens (every half second) until the
    autopilot has exited, squid answers on the new address and the service
    reports the new proxy healthy, marking each part in TIMELINE. Returns
    the new address ("" when the autopilot failed: the caller shows why)."""
    deadline = time.monotonic() + RECYCLE_TIMEOUT_S
    new_ip = ""
    while time.monotonic() < deadline:
        if pilot.poll() is not None:
            if pilot.returncode != 0:
                return new_ip
            timeline.mark(EXITED)
        log = provider_log.read_text() if provider_log.exists() else ""
        marks = provider_marks(log, watched.new_id)
        if "started" in marks:
            timeline.mark("new domain started (provider log)", marks["started"][0])
        if "address" in marks:
            at, new_ip = marks["address"]
            timeline.mark("new domain has its DHCP lease (provider log)", at)
        if watched.old_id not in {d.name() for d in conn.listAllDomains(0)}:
            timeline.mark("old domain gone from the host")
        if new_ip and SQUID not in timeline.marks:
            try:
                status, _, sock = proxy_connect(new_ip, watched.port, watched.target, timeout=2)
                sock.close()
                if status == 407:
                    timeline.mark(SQUID)
            except OSError:
                pass  # squid not listening yet
        listed = proxies(http)
        if watched.new_name in listed:
            timeline.mark("service lists the new proxy (its stack output read)")
            if listed[watched.new_name]["health"] == "healthy":
                timeline.mark(HEALTHY)
        if all(m in timeline.marks for m in (EXITED, SQUID, HEALTHY)):
            return new_ip
        time.sleep(0.5)
    raise AssertionError(
        f"the recycle did not end within {RECYCLE_TIMEOUT_S:.0f} s: {timeline.marks}"
    )
