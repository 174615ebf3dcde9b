"""Benchmark: `pulumi up` of a fleet of N tiny VMs against a fleet of one, on
the testbed, through the real CLI.

Run: scripts/bench kvm_fleet_parallelism   (brings the testbed up first)

Each fleet is a stack of its own with its own base image URL (so both fetch
once), created with `pulumi up --parallel 4N` and destroyed afterwards. With
the project's dynamic-provider host (providers/dynamic_host.py) the N VMs
boot together, so the ratio of the two wall times stays well under 2; with
the SDK's 4 workers, a fleet of more than 4 would take rounds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.http import FileServer
from tests.support.images import tiny_image
from tests.support.pulumi_cli import CliStack
from tests.support.testbed import Testbed, load_testbed
from tests.support.tinyfleet import tiny_fleet


def up(directory: Path, testbed: Testbed, server: FileServer, replicas: int) -> float:
    url = server.add(f"/{uuid.uuid4().hex[:8]}/tiny.qcow2", file=tiny_image())
    stack = CliStack(
        directory,
        f"par{uuid.uuid4().hex[:6]}",
        tiny_fleet(testbed, url, name="bench", replicas=replicas, ip_timeout=300),
    )
    try:
        started = time.monotonic()
        stack.ok("up", "--yes", "--skip-preview", "--parallel", str(4 * replicas))
        return time.monotonic() - started
    finally:
        stack.run("destroy", "--yes", "--skip-preview")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    testbed = load_testbed()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, FileServer() as server:
        one = up(Path(tmp) / "one", testbed, server, 1)
        many = up(Path(tmp) / "many", testbed, server, args.replicas)
    print(
        f"pulumi up of 1 tiny VM: {one:.1f} s; of {args.replicas}: {many:.1f} s = "
        f"{many / one:.2f}x one (goal: well under 2x)"
    )


if __name__ == "__main__":
    main()
