"""scripts/kube itself: two `up` at once change nothing the first did not,
and `down` leaves the machine as it found it (bridges, routes, iptables
rules, network namespaces, mounts, cgroups, ip_forward, /run/containerd),
with a pod running when it is called.

Runs after every other test on the cluster (its file sorts after theirs):
it takes the cluster down, then up and down again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.discovery import wait_for
from tests.support.kube import ROOT, Api, run_kube

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli, pytest.mark.kubernetes]

STATE = ROOT / ".kube"
OWNER_FILE = Path("/run/egress-proxies-kube.owner")


# What the libvirt testbed owns: its bridge, its guests' tap links, libvirt's
# iptables chains, the guests' cgroups. The testbed's tests change them in
# another worker meanwhile; the cluster's `down` answers for the rest.
TESTBED_BRIDGE = re.search(r"^BRIDGE=(\S+)", (ROOT / "scripts" / "testbed").read_text(), re.M)
TESTBEDS = (TESTBED_BRIDGE[1] if TESTBED_BRIDGE else "virbr-egtb", "vnet", "LIBVIRT_", "machine")


def _ours(lines: list[str]) -> list[str]:
    return sorted(line for line in lines if not any(mark in line for mark in TESTBEDS))


def _lines(*argv: str) -> list[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return _ours(done.stdout.splitlines())


def machine() -> dict[str, object]:
    """What up changes outside .kube/ and down must put back."""
    cgroups = _ours(
        [
            str(d)
            for root in Path("/sys/fs/cgroup").iterdir()
            if root.is_dir()
            for d in root.iterdir()
            if d.is_dir()
        ]
    )
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return {
        "links": _lines("ip", "-o", "link", "show"),
        "routes": _lines("ip", "route", "show"),
        "nat": _lines("iptables", "-t", "nat", "-S"),
        "filter": _lines("iptables", "-t", "filter", "-S"),
        "netns": sorted(p.name for p in Path("/run/netns").glob("*")),
        "mounts": _ours(mounts),
        "cgroups": cgroups,
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text(),
        "run_containerd": Path("/run/containerd").exists(),
    }


def alive(pid: int, name: str) -> bool:
    """PID is a live process called NAME (a zombie is not: this machine's
    init reaps the daemons' remains late)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return f"Name:\t{name[:15]}\n" in status and "State:\tZ" not in status


def pids() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(STATE.glob("*.pid"))}


@pytest.mark.timeout(900)
def test_up_twice_at_once_and_down_restores_the_machine(tmp_path: Path) -> None:
    down = run_kube("down")
    assert down.returncode == 0, down.stderr[-3000:]
    assert not STATE.exists()
    before = machine()
    # A claim on the machine by a checkout whose cluster was killed (a CI job
    # cut off): none of its daemons runs, so `up` takes its place.
    dead = tmp_path / "killed-checkout" / ".kube"
    dead.mkdir(parents=True)
    exited = subprocess.Popen([sys.executable, "-c", ""])
    exited.wait()
    for daemon in ("etcd", "kube-apiserver", "containerd", "kubelet"):
        (dead / f"{daemon}.pid").write_text(f"{exited.pid}\n")
    OWNER_FILE.write_text(f"{dead}\n")

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: run_kube("up", timeout=600), range(2))
    assert first.returncode == 0, first.stderr[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    took_over = f"the cluster of {dead.parent} was left by a run that was killed"
    assert [took_over in done.stderr for done in (first, second)].count(True) == 1
    assert OWNER_FILE.read_text().strip() == str(STATE)
    printed = [json.loads(done.stdout.splitlines()[-1]) for done in (first, second)]
    assert printed[0] == printed[1]
    assert set(printed[0]) == {
        "kubeconfig",
        "squidImage",
        "discoveryImage",
        "postgresImage",
        "clientCidr",
        "hostAddress",
    }
    # One of them started everything, the other found it running.
    started = [done for done in (first, second) if "started (pid" in done.stderr]
    assert len(started) == 1
    running = pids()
    assert set(running) == {
        "etcd.pid",
        "kube-apiserver.pid",
        "kube-controller-manager.pid",
        "kube-scheduler.pid",
        "containerd.pid",
        "kubelet.pid",
        "kube-proxy.pid",
    }
    again = run_kube("up")
    assert again.returncode == 0 and "started (pid" not in again.stderr, again.stderr[-2000:]
    assert pids() == running

    # A pod, so that down has a sandbox to tear down through the CNI.
    api = Api(Path(printed[0]["kubeconfig"]))
    try:
        wait_for(
            lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
            timeout=120,
            interval=0.5,
            what="the default service account",
        )
        pod = {
            "metadata": {"name": "sleeper"},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "squid",
                        "image": printed[0]["squidImage"],
                        "command": ["/usr/sbin/squid", "-N", "-f", "/dev/null"],
                    }
                ],
            },
        }
        api.create("/api/v1/namespaces/default/pods", pod)
        wait_for(
            lambda: (
                (api.get("/api/v1/namespaces/default/pods/sleeper") or {})
                .get("status", {})
                .get("podIP")
                is not None
            ),
            timeout=120,
            interval=0.5,
            what="the pod to run",
        )
    finally:
        api.close()
    assert machine() != before  # the bridge, its route, the pod's netns and rules

    down = run_kube("down", timeout=300)
    assert down.returncode == 0, down.stderr[-3000:]
    deadline = time.monotonic() + 10  # a just-ended process's cgroup goes a moment later
    while machine() != before and time.monotonic() < deadline:
        time.sleep(0.5)
    after = machine()
    assert {k: v for k, v in after.items() if v != before[k]} == {}
    assert not STATE.exists()
    for name, pid in running.items():  # every daemon up started has ended
        assert not alive(int(pid), name.removesuffix(".pid")), name
