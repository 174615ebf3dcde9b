"""Benchmark: what one autopilot recycle costs on stacks of N proxies, through
the real CLI on simulated kvm hosts, against a full no-change `pulumi up` of
the same stack measured in the same run (issue 40: a recycle must cost what
it changes, not the stack; goal: the recycle at 400 proxies at most 1.5x the
recycle at 100).

Run: scripts/bench autopilot_recycle
     (.venv/bin/python -m bench.autopilot_recycle [--sizes 100 400] [--modes default checkpoints])

Per size (proxies over 10 simulated hosts, providers.kvm.simulated): the
stack is made (`up`, not measured), then measured, each sampled over its
whole process tree (bench/_sampling.py): a no-change `up`, and
`python -m proxyinfra autopilot --once` recycling one proxy that three sites
reported blocked to the real discovery service (lease API; health verdicts
from a fake, every proxy healthy): the round reads the config and state,
asks the signals, plans, writes `generations.<slot>` and runs one update
targeted at the old and the new replica. Printed: wall time and the CPU of
the engine, of the program (language host) and of everything, and the ratios
recycle / no-change up at each size and recycle at each size / at the
first. Modes: as the autopilot runs by default (its kvm updates write the
state once, at the end: proxyinfra/autopilot/targets.py; the no-change `up`
with the engine's default, a checkpoint after each step), and with
PULUMI_SKIP_CHECKPOINTS=false set by the operator (a checkpoint after each
step of the recycle too).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

from bench._sampling import Run, Sampler, Usage
from tests.support.baseimages import random_qcow2, serve
from tests.support.discovery import ServerThread, settings_for
from tests.support.http import FileServer
from tests.support.pulumi_cli import ROOT, CliStack
from tests.support.simulated_fleet import fleet_config, simulated_env

HOSTS = 10
TOKEN = "bench-token"
# A proxy made within the policy's window is held (its count may still hold
# its old address's bans): the bench's window is short, and it waits it out.
WINDOW_S = 20
POLICY = {"recycle": {"bannedSites": 3, "window": f"{WINDOW_S}s", "healthyFloor": 0}}


@dataclass
class Measured:
    up: Run
    recycle: Run


def _sampled(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[Run, str]:
    started = time.monotonic()
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(process.pid)
    out, _ = process.communicate(timeout=7200)
    wall = time.monotonic() - started
    usage = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... failed:\n{out[-3000:]}")
    return Run(0, wall, usage), out


def _publish(stack: CliStack, fleet: Path) -> None:
    fleet.write_text(stack.ok("stack", "output", "--json", "--show-secrets").stdout)


def _report_blocked(url: str, victim: str) -> None:
    """Three sites report VICTIM blocked, through leases on it (a selector
    on its own label)."""
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as http:
        for n in range(1, 4):
            deadline = time.monotonic() + 60
            while True:
                grant = http.post(
                    "/v1/leases",
                    json={"holder": "bench", "selector": {"labels": {"bench": victim}}},
                )
                if grant.status_code == 201 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)  # the service reads the fleet file first
            grant.raise_for_status()
            lease = grant.json()
            assert lease["proxy"]["name"] == victim, lease
            http.post(
                f"/v1/leases/{lease['id']}/report",
                json={"outcome": "blocked", "target": f"site-{n}.example"},
            ).raise_for_status()
            http.delete(f"/v1/leases/{lease['id']}").raise_for_status()


def measure(size: int, where: Path, image_url: str, env: dict[str, str]) -> Measured:
    config = fleet_config(size, HOSTS, where, image_url)
    config["proxies"][0]["labels"] = {"bench": "p0-0"}
    config["autopilot"] = POLICY
    stack = CliStack(where / "stack", "bench", config, simulated_env(where / "hosts"))
    # Made fast, not measured (the state written once at the end).
    stack.extra_env = {**stack.extra_env, "PULUMI_SKIP_CHECKPOINTS": "true"}
    stack.ok("up", "--yes", "--skip-preview")
    stack.extra_env = simulated_env(where / "hosts")
    made = time.monotonic()
    run_env = stack.env() | env
    up_args = "up --yes --skip-preview --stack bench --non-interactive --expect-no-changes"
    up, _ = _sampled([str(ROOT / ".venv/bin/pulumi"), *up_args.split()], stack.directory, run_env)
    fleet = where / "fleet.json"
    _publish(stack, fleet)
    settings = settings_for(where, fleet_files=(fleet,), token=TOKEN, file_poll=0.1)
    time.sleep(max(0.0, WINDOW_S + 1 - (time.monotonic() - made)))
    with ServerThread(settings) as service:
        _report_blocked(service.url, "p0-0")
        command = [sys.executable, "-m", "proxyinfra", "--project-dir", str(stack.directory)]
        command += ["autopilot", "--stack", "bench", "--discovery", service.url, "--once"]
        recycle, out = _sampled(command, ROOT, run_env | {"DISCOVERY_TOKEN": TOKEN})
    changes = [json.loads(line) for line in out.splitlines() if '"event": "change"' in line]
    if [c["result"] for c in changes] != ["applied"]:
        raise RuntimeError(f"the autopilot did not recycle p0-0:\n{out[-3000:]}")
    stack.run("destroy", "--yes", "--skip-preview")
    return Measured(up, recycle)


def _line(label: str, size: int, run: Run) -> str:
    engine = run.usage.get("engine", Usage()).cpu
    program = run.usage.get("program", Usage()).cpu
    return (
        f"{label:<26} {size:4d} proxies  wall {run.wall:7.1f} s  engine cpu {engine:6.1f} s  "
        f"program cpu {program:6.1f} s  all cpu {run.cpu:6.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400])
    parser.add_argument(
        "--modes", nargs="+", choices=["default", "checkpoints"], default=["default"]
    )
    args = parser.parse_args()
    with TemporaryDirectory(prefix="autopilot-recycle-") as tmp, FileServer() as server:
        root = Path(tmp)
        image = serve(server, random_qcow2(root, data_mib=1, virtual_mib=16))
        for name in args.modes:
            env = {"PULUMI_SKIP_CHECKPOINTS": "false"} if name == "checkpoints" else {}
            mode = "checkpoints forced" if name == "checkpoints" else "default"
            first: tuple[int, Measured] | None = None
            for size in args.sizes:
                where = root / f"{name}-{size}"
                where.mkdir()
                got = measure(size, where, image.url, env)
                print(_line(f"no-change up, {mode}", size, got.up), flush=True)
                print(_line(f"recycle, {mode}", size, got.recycle), flush=True)
                up_engine = got.up.usage.get("engine", Usage()).cpu
                rec_engine = got.recycle.usage.get("engine", Usage()).cpu
                ratio = got.recycle.wall / got.up.wall
                print(
                    f"  recycle / no-change up at {size}: wall {ratio:.2f}, "
                    f"engine cpu {rec_engine / up_engine if up_engine else float('nan'):.2f}",
                    flush=True,
                )
                if first is None:
                    first = (size, got)
                    continue
                size0, base = first
                base_engine = base.recycle.usage.get("engine", Usage()).cpu
                print(
                    f"  recycle at {size} / recycle at {size0}: "
                    f"wall {got.recycle.wall / base.recycle.wall:.2f}, "
                    f"engine cpu {rec_engine / base_engine if base_engine else float('nan'):.2f} "
                    f"(goal: at most 1.5)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
