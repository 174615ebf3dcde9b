"""Benchmark: how many dynamic-resource calls run at once, in the provider
process alone and through the real Pulumi CLI.

Run: .venv/bin/python -m bench.dynamic_provider_parallelism   (or scripts/bench dynamic_provider_parallelism)

Pulumi runs every Python dynamic resource of a program in one provider
process: the SDK's (`python -m pulumi.dynamic`, 4 workers) or the project's
(providers/dynamic_host.py, the plugin script Pulumi.yaml names). Part 1 starts each the way the engine does (tests/harness/engine.py)
and sends it N creates at once, each of which only sleeps --hold seconds, as a
ProxyDomain create holds its call while the guest boots. Part 2 runs `pulumi
up --parallel N` of a program of N such resources (bench/hold_program) with
the real CLI, against one resource. Each ratio (N against one) is how many
rounds N calls need: 1.0 when all run at once.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulumi.dynamic import CreateResult, ResourceProvider

from tests.harness.engine import DYNAMIC_TYPE, HOST_MODULE, ProviderProcess, provider_inputs


class Hold(ResourceProvider):
    """A create that only waits, standing in for a boot."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def create(self, props: Any) -> CreateResult:
        time.sleep(self.seconds)
        return CreateResult(id_="held", outs={})


def wall(engine: ProviderProcess, props: dict[str, Any], calls: int) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(calls) as pool:
        urns = [f"urn:pulumi:bench::bench::{DYNAMIC_TYPE}::r{i}" for i in range(calls)]
        list(pool.map(lambda urn: engine.create(urn, props), urns))
    return time.monotonic() - started


def processes(hold: float, calls: list[int]) -> None:
    props = provider_inputs(Hold(hold), {})
    for module in ("pulumi.dynamic", HOST_MODULE):
        with ProviderProcess(module=module) as engine:
            baseline = wall(engine, props, 1)
            print(f"{module}: 1 create holding {hold:.1f} s: {baseline:.2f} s")
            for count in calls:
                seconds = wall(engine, props, count)
                ratio = seconds / baseline
                print(
                    f"  {count:3d} creates at once: {seconds:6.2f} s = {ratio:4.1f}x one "
                    f"(about {count / ratio:.1f} running at a time)"
                )


def cli(hold: float, count: int) -> float:
    """`pulumi up` of `count` resources against one, through the real CLI;
    returns the ratio."""
    import tempfile
    from pathlib import Path

    from tests.support.pulumi_cli import ROOT, CliStack

    def up(directory: Path, resources: int) -> float:
        stack = CliStack(
            directory,
            f"hold{resources}",
            {"count": resources, "hold": hold},
            program=ROOT / "bench" / "hold_program",
        )
        started = time.monotonic()
        stack.ok("up", "--yes", "--skip-preview", "--parallel", str(max(resources, 1)))
        seconds = time.monotonic() - started
        stack.ok("destroy", "--yes", "--skip-preview")
        return seconds

    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        one = up(Path(tmp) / "one", 1)
        many = up(Path(tmp) / "many", count)
    # What pulumi up costs without any create (engine, program, plugin start):
    # measured apart so the ratio is about the creates.
    ratio = many / one
    print(
        f"pulumi up (the CLI): 1 resource holding {hold:.1f} s: {one:.2f} s; "
        f"{count} at --parallel {count}: {many:.2f} s = {ratio:.2f}x one (goal <= 1.5x)"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=1.0, help="seconds each create waits")
    parser.add_argument("--calls", type=int, nargs="+", default=[4, 8, 32])
    parser.add_argument("--cli-resources", type=int, default=32)
    parser.add_argument("--no-cli", action="store_true", help="skip the real CLI's part")
    args = parser.parse_args()
    processes(args.hold, args.calls)
    if not args.no_cli:
        cli(args.hold, args.cli_resources)


if __name__ == "__main__":
    main()
