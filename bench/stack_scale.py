"""Benchmark: what a stack of N proxies costs through the real Pulumi CLI.

Run: scripts/bench stack_scale   (.venv/bin/python -m bench.stack_scale [--sizes 50 100 200 400])

For each size, `pulumi preview` of a new stack of N kvm proxies spread over
10 hosts (no host is contacted in a preview), and beside it, in the same
run, the engine's floor: bench/floor_program registering as many trivial
dynamic resources. Each is run twice: as the engine runs by default, and
with PULUMI_SKIP_CHECKPOINTS=true (what scripts/up sets: the self-managed
backend then writes the state once at the end instead of after every step;
docs/architecture.md, decision log). Printed per run: wall time, CPU and
peak RSS per process (the engine, the language host's program, the dynamic
provider), CPU per resource, the growth exponent of the engine's CPU from
the size before, and the ratio of CPU per resource to the floor's.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from tests.support.pulumi_cli import PULUMI, ROOT, CliStack
from tests.support.simulated_fleet import fleet_config

HOSTS = 10
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Usage:
    """CPU seconds and peak RSS (MiB) of one kind of process."""

    cpu: float = 0.0
    rss: float = 0.0


@dataclass
class Run:
    resources: int
    wall: float
    usage: dict[str, Usage] = field(default_factory=dict)

    @property
    def cpu(self) -> float:
        return sum(u.cpu for u in self.usage.values())


def kind(pid: int) -> str:
    """engine, program or provider (what each process of a stack operation is)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    if comm == "pulumi":
        return "engine"
    if "dynamic_host" in cmdline or "pulumi.dynamic" in cmdline:
        return "provider"
    if "language-python" in cmdline or "__main__" in cmdline or "_exec" in cmdline:
        return "program"
    return "other"


class Sampler:
    """Polls /proc for the process tree under `root`: each process's last CPU
    time and peak RSS (a process that ends between two looks loses at most
    the last interval's CPU)."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root = root
        self.seen: dict[int, tuple[str, float, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        return tree

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            for pid in self._tree():
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE / 2**20
                except (OSError, IndexError, ValueError):
                    continue
                cpu = (int(fields[11]) + int(fields[12])) / _TICK
                name, old_cpu, old_rss = self.seen.get(pid, (kind(pid), 0.0, 0.0))
                self.seen[pid] = (name, max(old_cpu, cpu), max(old_rss, rss))
            self._stop.wait(interval)

    def stop(self) -> dict[str, Usage]:
        self._stop.set()
        self._thread.join()
        usage: dict[str, Usage] = {}
        for name, cpu, rss in self.seen.values():
            total = usage.setdefault(name, Usage())
            total.cpu += cpu
            total.rss = max(total.rss, rss)
        return usage


def preview(stack: CliStack) -> Run:
    started = time.monotonic()
    process = subprocess.Popen(
        [str(PULUMI), "preview", "--non-interactive"],
        cwd=stack.directory,
        env=stack.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sampler = Sampler(process.pid)
    out, _ = process.communicate(timeout=7200)
    wall = time.monotonic() - started
    usage = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"pulumi preview failed:\n{out[-3000:]}")
    created = re.search(r"\+ (\d+) to create", out)
    return Run(int(created.group(1)) if created else 0, wall, usage)


def exponent(small: float, large: float, ratio: float) -> float:
    return math.log(large / small) / math.log(ratio) if small > 0 and large > 0 else math.nan


def report(
    label: str, size: int, run: Run, before: tuple[int, Run] | None, floor: Run | None
) -> None:
    per = run.cpu / max(run.resources, 1) * 1000
    parts = [
        f"{label:<22} {size:4d} proxies {run.resources:5d} resources  wall {run.wall:7.1f} s",
        f"cpu {run.cpu:7.1f} s ({per:5.1f} ms/resource)",
    ]
    for name in ("engine", "program", "provider"):
        use = run.usage.get(name, Usage())
        parts.append(f"{name} {use.cpu:6.1f} s {use.rss:5.0f} MiB")
    if before is not None:
        size0, run0 = before
        engine0 = run0.usage.get("engine", Usage()).cpu
        engine = run.usage.get("engine", Usage()).cpu
        parts.append(f"engine growth exponent {exponent(engine0, engine, size / size0):.2f}")
    if floor is not None and floor.resources:
        floor_engine = floor.usage.get("engine", Usage()).cpu
        engine = run.usage.get("engine", Usage()).cpu
        # Per resource (the two runs register the same number, give or take one).
        ratio = (engine / run.resources) / (floor_engine / floor.resources) if floor_engine else 0
        parts.append(f"x floor: engine {ratio:.2f}, all {run.cpu / floor.cpu:.2f}")
    print("  ".join(parts), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400])
    args = parser.parse_args()
    with TemporaryDirectory(prefix="stack-scale-") as tmp:
        root = Path(tmp)
        for skip in (False, True):
            env = {"PULUMI_SKIP_CHECKPOINTS": "true"} if skip else {}
            mode = "skip checkpoints" if skip else "default"
            previous: dict[str, tuple[int, Run]] = {}
            for size in args.sizes:
                where = root / f"{'skip' if skip else 'default'}-{size}"
                where.mkdir()
                ours = preview(
                    CliStack(
                        where / "fleet",
                        "fleet",
                        fleet_config(size, HOSTS, where, "http://img.invalid/d.qcow2"),
                        env,
                    )
                )
                floor_stack = CliStack(
                    where / "floor",
                    "floor",
                    {"count": str(ours.resources)},
                    env,
                    program=ROOT / "bench" / "floor_program",
                )
                floor = preview(floor_stack)
                report(f"floor, {mode}", size, floor, previous.get("floor"), None)
                report(f"fleet, {mode}", size, ours, previous.get("fleet"), floor)
                previous = {"floor": (size, floor), "fleet": (size, ours)}


if __name__ == "__main__":
    main()
