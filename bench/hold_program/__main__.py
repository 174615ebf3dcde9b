"""A Pulumi program of `count` dynamic resources whose create only waits
`hold` seconds (bench/dynamic_provider_parallelism.py runs it with the CLI)."""

from __future__ import annotations

import pulumi

from bench.dynamic_provider_parallelism import Hold


class Held(pulumi.dynamic.Resource):
    def __init__(self, name: str, hold: float) -> None:
        super().__init__(Hold(hold), name, {})


config = pulumi.Config()
for index in range(int(config.require("count"))):
    Held(f"held-{index}", float(config.require("hold")))
