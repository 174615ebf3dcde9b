"""The engine's process for the project's Python dynamic resources, with room
for many calls at once.

Pulumi starts every Python dynamic resource of a stack operation in one
`python -m pulumi.dynamic` process (the plugin `pulumi-resource-pulumi-python`)
whose gRPC server is built with ``futures.ThreadPoolExecutor(max_workers=4)``
(pulumi/dynamic/__main__.py). A ProxyDomain create holds its worker until
the guest has an address, so a fleet of N new VMs came up four at a time.
The project's own plugin script (scripts/pulumi-resource-pulumi-python,
named by Pulumi.yaml's `plugins:`, which the engine takes before PATH and the
one bundled with the CLI) runs this module instead: it gives the executors of
this process at least WORKERS threads, then runs the SDK's server unchanged.

What it relies on, pinned by tests/provider/test_dynamic_host.py: the SDK's
``main()`` builds its executor through the ``futures`` module's attribute
``ThreadPoolExecutor`` at call time. If an SDK upgrade changes that, the
test fails and the process still works, only four calls at a time.
"""

from __future__ import annotations

import concurrent.futures
import os
import runpy
from typing import Any

WORKERS_ENV = "EGRESS_PROXIES_PROVIDER_THREADS"
DEFAULT_WORKERS = 64  # above the engine's --parallel default (4 x cores) on any host we run


def workers() -> int:
    text = os.environ.get(WORKERS_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_WORKERS


_SDK_EXECUTOR = concurrent.futures.ThreadPoolExecutor


class WideExecutor(_SDK_EXECUTOR):
    """A thread pool never smaller than workers(): every call the engine
    sends at once runs at once (the engine's --parallel bounds them)."""

    def __init__(self, max_workers: int | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(max(max_workers or 0, workers()), *args, **kwargs)


def main() -> None:
    # Only this process: it serves the dynamic providers and nothing else.
    concurrent.futures.ThreadPoolExecutor = WideExecutor  # type: ignore[misc]
    runpy.run_module("pulumi.dynamic", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
