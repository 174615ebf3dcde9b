"""Benchmark: how many dynamic-resource calls the Pulumi provider process runs at once.

Run: .venv/bin/python -m bench.dynamic_provider_parallelism   (or scripts/bench dynamic_provider_parallelism)

Pulumi runs every Python dynamic resource of a program in one
`python -m pulumi.dynamic` process. This starts that process the way the engine
does (tests/harness/engine.py) and sends it N creates at once, each of which
only sleeps --hold seconds, as a ProxyDomain create holds its call while the
guest boots. Baseline, in the same run: one such create. The ratio of the two
wall times is how many rounds N calls need; with N workers it would be 1.0.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulumi.dynamic import CreateResult, ResourceProvider

from tests.harness.engine import DYNAMIC_TYPE, ProviderProcess, provider_inputs


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=1.0, help="seconds each create waits")
    parser.add_argument("--calls", type=int, nargs="+", default=[2, 4, 5, 8, 16, 32])
    args = parser.parse_args()
    props = provider_inputs(Hold(args.hold), {})
    with ProviderProcess() as engine:
        baseline = wall(engine, props, 1)
        print(f"baseline: 1 create holding {args.hold:.1f} s: {baseline:.2f} s")
        for calls in args.calls:
            seconds = wall(engine, props, calls)
            ratio = seconds / baseline
            print(
                f"{calls:3d} creates at once: {seconds:6.2f} s = {ratio:4.1f}x the baseline "
                f"(about {calls / ratio:.1f} running at a time)"
            )


if __name__ == "__main__":
    main()
