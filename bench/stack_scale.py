"""Benchmark: what a stack of N proxies costs through the real Pulumi CLI.

Run: scripts/bench stack_scale
     (.venv/bin/python -m bench.stack_scale [--sizes 50 100 200 400] [--lifecycle-sizes 100 400])

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

Then, for each of --lifecycle-sizes (default 100 and 400), in both modes,
the rest of a stack's life through the real CLI on simulated hosts
(EGRESS_PROXIES_SIMULATED_HOSTS, providers.kvm.simulated: libvirt's test
driver in the provider process): `up`, a no-change `preview`, `refresh` and
`destroy`, the floor program's `up` and `destroy` of as many resources
beside them, and the state's size per proxy (`pulumi stack export`) against
the floor's per resource and the goal (issue 42: at most 12 KiB per proxy),
with the bytes per proxy of each kind of resource in it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench._sampling import Run, Sampler, Usage
from tests.support.baseimages import random_qcow2, serve
from tests.support.http import FileServer
from tests.support.pulumi_cli import ROOT, CliStack
from tests.support.simulated_fleet import fleet_config, simulated_env

HOSTS = 10
STATE_GOAL_KIB = 12.0  # per kvm proxy, in `pulumi stack export` (issue 42)


def timed(stack: CliStack, *args: str, resources: int = 0) -> Run:
    """`pulumi ARGS` on STACK, sampled; RESOURCES: what the run is about (a
    preview of a new stack counts its creates itself)."""
    started = time.monotonic()
    process = stack.start(*args)
    sampler = Sampler(process.pid)
    out, _ = process.communicate(timeout=7200)
    wall = time.monotonic() - started
    usage = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"pulumi {' '.join(args)} failed:\n{out[-3000:]}")
    created = re.search(r"\+ (\d+) to create", out)
    return Run(resources or (int(created.group(1)) if created else 0), wall, usage)


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


def floor_stack(where: Path, resources: int, env: dict[str, str]) -> CliStack:
    """A stack of bench/floor_program registering RESOURCES trivial resources."""
    return CliStack(
        where / "floor",
        "floor",
        {"count": str(resources)},
        env,
        program=ROOT / "bench" / "floor_program",
    )


def _size(value: object) -> int:
    return len(json.dumps(value).encode())


def state_by_kind(state: dict[str, Any]) -> dict[str, int]:
    """Bytes of each kind of resource in an export (the resource's JSON):
    kvm resources by their name's last word (seed, overlay, domain), the
    base images as `image`, others by type."""
    kinds: dict[str, int] = {}
    for resource in state["deployment"].get("resources") or []:
        name = resource["urn"].rsplit("::", 1)[1]
        if resource["type"] == "pulumi-python:dynamic:Resource":
            kind = "image" if "-image-" in name else name.rsplit("-", 1)[1]
        else:
            kind = resource["type"].rsplit(":", 1)[1]
        kinds[kind] = kinds.get(kind, 0) + _size(resource)
    return kinds


def lifecycle(size: int, where: Path, image_url: str, env: dict[str, str], mode: str) -> None:
    """up, a no-change preview, refresh and destroy of SIZE proxies on
    simulated hosts, and the state's size per proxy after up; beside them the
    floor program's up and destroy of as many resources, and its state."""
    stack = CliStack(
        where / "life",
        "life",
        fleet_config(size, HOSTS, where, image_url),
        env | simulated_env(where / "hosts"),
    )
    up = timed(stack, "up", "--yes", "--skip-preview")
    exported = stack.export()
    up.resources = resources = len(exported["deployment"]["resources"])
    state = _size(exported)
    floor = floor_stack(where, resources, env)
    floor_up = timed(floor, "up", "--yes", "--skip-preview", resources=resources)
    floor_state = _size(floor.export())
    report(f"floor up, {mode}", size, floor_up, None, None)
    report(f"up, {mode}", size, up, None, floor_up)
    steps = (
        ("no-change preview", ("preview", "--expect-no-changes")),
        ("refresh", ("refresh", "--yes", "--skip-preview", "--expect-no-changes")),
    )
    for label, args in steps:
        report(f"{label}, {mode}", size, timed(stack, *args, resources=resources), None, None)
    floor_down = timed(floor, "destroy", "--yes", "--skip-preview", resources=resources)
    report(f"floor destroy, {mode}", size, floor_down, None, None)
    down = timed(stack, "destroy", "--yes", "--skip-preview", resources=resources)
    report(f"destroy, {mode}", size, down, None, floor_down)
    per_resource = floor_state / resources
    print(
        f"state, {mode:<15} {size:4d} proxies {resources:5d} resources  "
        f"{state / 1024:7.0f} KiB = {state / size / 1024:5.2f} KiB/proxy; "
        f"floor {per_resource / 1024:4.2f} KiB/resource, "
        f"{per_resource * resources / size / 1024:5.2f} KiB/proxy at "
        f"{resources / size:.2f} resources/proxy (x floor {state / (per_resource * resources):.2f}); "
        f"goal <= {STATE_GOAL_KIB:.0f} KiB/proxy: "
        + ("met" if state / size / 1024 <= STATE_GOAL_KIB else "NOT met"),
        flush=True,
    )
    kinds = sorted(state_by_kind(exported).items(), key=lambda kind: -kind[1])
    print(
        f"state by kind {size:4d} proxies, bytes/proxy: "
        + ", ".join(f"{kind} {total / size:,.0f}" for kind, total in kinds),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400])
    parser.add_argument(
        "--lifecycle-sizes",
        type=int,
        nargs="*",
        default=[100, 400],
        help="up, no-change preview, refresh, destroy on simulated hosts (none: skip)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["default", "skip"],
        default=["default", "skip"],
        help="the engine as it runs by default, and with PULUMI_SKIP_CHECKPOINTS=true",
    )
    args = parser.parse_args()
    with TemporaryDirectory(prefix="stack-scale-") as tmp, FileServer() as server:
        root = Path(tmp)
        image = serve(server, random_qcow2(root, data_mib=1, virtual_mib=16))
        for name in args.modes:
            env = {"PULUMI_SKIP_CHECKPOINTS": "true"} if name == "skip" else {}
            mode = "skip checkpoints" if name == "skip" else "default"
            previous: dict[str, tuple[int, Run]] = {}
            for size in args.sizes:
                where = root / f"{name}-{size}"
                where.mkdir()
                config = fleet_config(size, HOSTS, where, "http://img.invalid/d.qcow2")
                ours = timed(CliStack(where / "fleet", "fleet", config, env), "preview")
                floor = timed(floor_stack(where, ours.resources, env), "preview")
                report(f"floor, {mode}", size, floor, previous.get("floor"), None)
                report(f"fleet, {mode}", size, ours, previous.get("fleet"), floor)
                previous = {"floor": (size, floor), "fleet": (size, ours)}
            for size in args.lifecycle_sizes:
                where = root / f"life-{name}-{size}"
                where.mkdir()
                lifecycle(size, where, image.url, env, mode)


if __name__ == "__main__":
    main()
