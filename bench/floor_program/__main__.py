"""The engine's floor for bench/stack_scale.py: a Pulumi program registering
`count` trivial dynamic resources (the type every kvm resource has), with
tiny inputs and a stateless provider pickled by reference, nothing else."""

from __future__ import annotations

import pulumi

from bench.floor_program.provider import Nothing


class Trivial(pulumi.dynamic.Resource):
    def __init__(self, name: str) -> None:
        super().__init__(Nothing(), name, {"value": name})


for index in range(int(pulumi.Config().require("count"))):
    Trivial(f"trivial-{index}")
