"""A gcp group is replaced `maxUnavailable` at a time (proxyinfra/rollout.py).

An instance's name is fixed, so its replacement deletes it first; each
replica's instance is registered only once the instance of the replica
`maxUnavailable` places before it has its address. Under mocks every
registration is a create that takes a while (the hook below sleeps), so a
replica that did not wait would start while its predecessor is still being
made; and the creates of a first wave are held until all of the wave have
begun (a barrier), so replicas that should go together are shown to, on any
machine's timing. The engine's side (registration order is what it acts on)
is the same for kvm, tested through the real CLI in
tests/engine/test_cli_rollout.py.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import pytest
from pulumi.runtime.mocks import MockResourceArgs

from proxyinfra.names import proxy_id
from tests.harness.program import ProgramResult, run_program
from tests.support.mock_clouds import INSTANCE, mock_resource
from tests.support.stack_config import gcp_provider, placement, proxy, squid, stack_config

PROGRAM = "proxyinfra.program:main"
HOOK = "tests.program.test_gcp_rollout:slow_instances"
CREATE_S = 0.4
WAVE_ENV = "TEST_FIRST_WAVE"  # how many instance creates the barrier holds
WAVE_TIMEOUT_S = 30.0
# Made where the hook runs: the program's process, whose environment run() sets.
_WAVE = threading.Barrier(int(os.environ.get(WAVE_ENV, "1")))
_creates = itertools.count()  # next() on it is atomic: the mock calls come from threads


def slow_instances(args: MockResourceArgs) -> tuple[str, dict[str, Any]] | None:
    """An instance's create takes CREATE_S, the first wave's only once the
    whole wave has begun (else the barrier breaks and the create fails);
    when it began and ended are outputs."""
    started = time.monotonic()
    made = mock_resource(args)
    if args.typ != INSTANCE or made is None:
        return made
    if next(_creates) < _WAVE.parties:
        _WAVE.wait(WAVE_TIMEOUT_S)
    time.sleep(CREATE_S)
    ident, outputs = made
    return ident, {**outputs, "testStarted": started, "testEnded": time.monotonic()}


def run(group: dict[str, Any], first_wave: int = 1) -> ProgramResult:
    provider = gcp_provider()
    provider["gcp"]["staticIp"] = True  # the address exists before its instance
    config = stack_config([provider], [group], squid(username="crawler"))
    env = {WAVE_ENV: str(first_wave)}
    return run_program(PROGRAM, config, new_resource_hook=HOOK, env=env).raise_for_error()


def spans(result: ProgramResult, group: str, replicas: int) -> list[tuple[float, float]]:
    found = []
    for ordinal in range(replicas):
        outputs = result.resource(f"{group}-{ordinal}-instance", INSTANCE).outputs
        found.append((outputs["testStarted"], outputs["testEnded"]))
    return found


def where() -> dict[str, Any]:
    return placement("e2-small", "debian", zone="europe-west1-b")


def test_each_instance_waits_for_the_one_max_unavailable_before_it() -> None:
    result = run(proxy("eu", "gcp-eu", replicas=4, where=where()))  # 25 %: one at a time
    made = spans(result, "eu", 4)
    for (_, before_ended), (started, _) in itertools.pairwise(made):
        assert started >= before_ended
    # The name it waited with is its own, and it brought no dependency.
    instance = result.resource("eu-1-instance", INSTANCE)
    assert instance.inputs["name"] == proxy_id("egress-proxies", "dev", "eu-1")
    assert not any("eu-0" in urn for urn in instance.dependencies)
    hosts = {entry["name"]: entry["host"] for entry in result.output("fleet")["proxies"]}
    addresses = result.resources_of_type("gcp:compute/address:Address")
    assert sorted(hosts.values()) == sorted(a.outputs["address"] for a in addresses)


@pytest.mark.parametrize(("max_unavailable", "together"), [(2, 2), ("100%", 4)])
def test_max_unavailable_sets_how_many_go_together(max_unavailable: Any, together: int) -> None:
    group = proxy("eu", "gcp-eu", replicas=4, where=where()) | {"maxUnavailable": max_unavailable}
    made = spans(run(group, first_wave=together), "eu", 4)
    first_wave_end = min(ended for _, ended in made[:together])
    # The first wave went side by side (the barrier held each until all had
    # begun); the rest waited for it.
    assert all(started < first_wave_end for started, _ in made[:together])
    assert all(started >= first_wave_end for started, _ in made[together:])
