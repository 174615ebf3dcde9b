"""A partial run of the stack program (proxyinfra/partial.py), under mocks:
what the autopilot's targeted update runs, so that a recycle of one proxy
costs one proxy whatever the stack's size. The program registers only the
ticket's replicas and writes every other manifest entry from the stack's
previous `fleet` output (a StackReference to itself, answered here by the
hook from $PREVIOUS_FLEET), in the order a whole run writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pulumi.runtime.mocks import MockResourceArgs

from proxyinfra.partial import ENV, merged_proxies, read_ticket, ticket
from proxyinfra.validation import ConfigError
from tests.harness.program import ProgramResult, run_program
from tests.support.mock_clouds import mock_resource
from tests.support.stack_config import (
    external_provider,
    placement,
    proxy,
    squid,
    stack_config,
)
from tests.support.stack_config import unreachable_kvm_provider as kvm

PROGRAM = "proxyinfra.program:main"
HOOK = "tests.program.test_partial:previous_fleet_hook"
PROXY = "egress-proxies:fleet:Proxy"


def previous_fleet_hook(args: MockResourceArgs) -> tuple[str, dict[str, Any]] | None:
    """The stack's own outputs for its StackReference; the clouds' otherwise."""
    if args.typ == "pulumi:pulumi:StackReference":
        previous = json.loads(os.environ["PREVIOUS_FLEET"])
        return args.name, {"name": args.name, "outputs": {"fleet": previous}}
    return mock_resource(args)


def config(directory: Path, generations: dict[str, int] | None = None) -> dict[str, Any]:
    home = proxy("home", "home", replicas=3, where=placement())
    made = stack_config([kvm(directory)], [home], squid(username="crawler"))
    return {**made, "generations": generations} if generations else made


def run(made: dict[str, Any], env: dict[str, str] | None = None) -> ProgramResult:
    return run_program(PROGRAM, made, new_resource_hook=HOOK, env=env)


def proxies(result: ProgramResult) -> list[str]:
    return [r.name for r in result.resources_of_type(PROXY)]


def test_a_partial_run_registers_only_the_ticket_s_replicas(tmp_path: Path) -> None:
    whole = run(config(tmp_path)).raise_for_error()
    previous = whole.output("fleet")
    recycled = config(tmp_path, {"home-1": 2})
    with ticket("dev", ["home-1-g2"]) as entry:
        partial = run(recycled, {**entry, "PREVIOUS_FLEET": json.dumps(previous)})
    partial.raise_for_error()
    assert proxies(whole) == ["home-0", "home-1", "home-2"]
    assert proxies(partial) == ["home-1-g2"]
    # Nothing of the others: no resource below a Proxy that was not registered.
    top = partial.resource("home-1-g2", PROXY).urn
    below = {r.parent for r in partial.resources if r.parent and "Proxy::" in r.parent}
    assert below == {top}
    # The manifest a whole run of the same config writes: same order, same
    # entries (credentials included) for the replicas that did not change.
    fleet = partial.output("fleet")
    again = run(recycled).raise_for_error().output("fleet")
    assert [p["name"] for p in fleet["proxies"]] == ["home-0", "home-1-g2", "home-2"]
    assert fleet["proxies"][0] == previous["proxies"][0] == again["proxies"][0]
    assert fleet["proxies"][2] == previous["proxies"][2] == again["proxies"][2]
    assert fleet["proxies"][1] == again["proxies"][1]
    assert fleet["proxies"][0]["auth"]["password"]  # carried, not dropped


def test_a_replica_the_previous_output_lacks_is_refused(tmp_path: Path) -> None:
    """Scaled by hand without an update: a partial run cannot know the new
    replica's entry, and says to run a whole `up`."""
    previous = run(config(tmp_path)).raise_for_error().output("fleet")
    grown = config(tmp_path)
    grown["proxies"][0]["replicas"] = 4
    with ticket("dev", []) as entry:
        result = run(grown, {**entry, "PREVIOUS_FLEET": json.dumps(previous)})
    assert result.error is not None
    assert (
        "replica 'home-3' is in the config but neither in this partial run" in result.error.message
    )
    assert "run a whole `pulumi up` first" in result.error.message


def test_a_ticket_that_is_gone_is_refused_before_any_resource(tmp_path: Path) -> None:
    gone = tmp_path / "gone.json"
    result = run(config(tmp_path), {ENV: str(gone)})
    assert result.error is not None
    assert f"${ENV}: names '{gone}', which does not exist" in result.error.message
    assert proxies(result) == []


# -- the ticket and the merge, alone ----------------------------------------------------


def test_the_ticket_exists_only_inside_its_block() -> None:
    with ticket("prod", ["b", "a"]) as entry:
        path = Path(entry[ENV])
        assert read_ticket("prod", entry) is not None
        assert read_ticket("prod", entry).replicas == frozenset({"a", "b"})  # type: ignore[union-attr]
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert not path.exists() and not path.parent.exists()
    assert read_ticket("prod", {}) is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"stack": "dev", "replicas": ["a"]}', "not a ticket for stack 'prod'"),
        ('{"stack": "prod", "replicas": "a"}', "not a ticket for stack 'prod'"),
        ('{"stack": "prod", "replicas": [1]}', "not a ticket for stack 'prod'"),
        ("not json", "which is not a ticket ("),
    ],
)
def test_a_ticket_for_another_stack_or_garbled_is_refused(
    tmp_path: Path, content: str, why: str
) -> None:
    path = tmp_path / "ticket.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as refused:
        read_ticket("prod", {ENV: str(path)})
    assert why in str(refused.value) and "unset it" in str(refused.value)


def test_merged_entries_follow_the_config_order() -> None:
    previous = {"proxies": [{"name": "c", "v": 1}, {"name": "a", "v": 1}, {"name": "gone"}]}
    merged = merged_proxies(["a", "b", "c"], {"b": {"name": "b", "v": 2}}, previous)
    # A previous entry gets back the null zone the engine dropped (below).
    assert merged == [
        {"zone": None, "name": "a", "v": 1},
        {"name": "b", "v": 2},
        {"zone": None, "name": "c", "v": 1},
    ]


def test_a_previous_entry_read_back_without_its_null_zone_is_written_with_it(
    tmp_path: Path,
) -> None:
    """The engine drops null values from the outputs a StackReference hands
    the program: an external (or kubernetes) proxy's entry comes back
    without its `zone`, which the manifest requires (null). Before it was
    put back, every partial run of such a stack failed in the program."""
    made = stack_config(
        [kvm(tmp_path), external_provider("corp")],
        [
            proxy("home", "home", replicas=2, where=placement()),
            proxy("partner", "corp", url="http://crawler:partner-pass@127.0.0.1:9"),
        ],
        squid(username="crawler"),
    )
    previous = run(made).raise_for_error().output("fleet")
    [partner] = [p for p in previous["proxies"] if p["name"] == "partner"]
    assert partner["zone"] is None
    read_back = [{k: v for k, v in p.items() if v is not None} for p in previous["proxies"]]
    with ticket("dev", ["home-1-g2"]) as entry:
        partial = run(
            {**made, "generations": {"home-1": 2}},
            {**entry, "PREVIOUS_FLEET": json.dumps({**previous, "proxies": read_back})},
        )
    fleet = partial.raise_for_error().output("fleet")
    assert [p["name"] for p in fleet["proxies"]] == ["home-0", "home-1-g2", "partner"]
    assert fleet["proxies"][2] == partner
