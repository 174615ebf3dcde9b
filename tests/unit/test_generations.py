"""Proxy generations: the naming rule (proxyinfra/generations.py), the stack
config key `egress-proxies:generations` as validation takes or refuses it
(every refusal by path), and the readers that group proxies by name (the
discovery service's signals, the autopilot's fleet)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from discovery.book.signals import group_of as service_group_of
from discovery.book.signals import groups_of
from proxyinfra.autopilot.fleet import FleetProxy, groups_of_stack
from proxyinfra.generations import group_of, parse_name, replica_name
from proxyinfra.names import proxy_id
from proxyinfra.validation import ConfigError, validate
from tests.support.stack_config import (
    external_provider,
    gcp_provider,
    placement,
    proxy,
    stack_config,
    unreachable_kvm_provider,
)

# -- the naming rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slot", "generation", "name"),
    [
        ("home-0", 1, "home-0"),  # generation 1 is the slot itself: old stacks keep every name
        ("home-0", 2, "home-0-g2"),
        ("home-eu-12", 10, "home-eu-12-g10"),
        ("corp", 1, "corp"),  # an external entry's one proxy
    ],
)
def test_a_replica_is_named_by_its_slot_and_generation(
    slot: str, generation: int, name: str
) -> None:
    assert replica_name(slot, generation) == name
    assert parse_name(name) == (slot, generation)


@pytest.mark.parametrize(
    "name",
    ["home-0-g1", "home-0-g02", "home-0-g0", "corp-g2", "home-g2", "a-0-g", "home-0-G2", "-0-g2"],
)
def test_other_suffixes_are_no_generation(name: str) -> None:
    # Generation 1 has no suffix, N is written without leading zeros, and only
    # a slot (`<entry>-<n>`) has generations: these are names at generation 1.
    assert parse_name(name) == (name, 1)


@pytest.mark.parametrize(
    "name",
    ["home-0", "home-0-g2", "home-0-g1", "corp", "corp-g2", "a-1-g3-g4", "x-9-g10", "-3", "web-"],
)
def test_the_rule_is_a_bijection(name: str) -> None:
    assert replica_name(*parse_name(name)) == name


@pytest.mark.parametrize(
    ("slot", "generation"),
    [("home-0", 0), ("home-0", -1), ("home-0", True), ("corp", 2), ("home-0-g2", 3)],
)
def test_no_name_for_a_bad_generation_or_a_slot_that_is_none(slot: str, generation: Any) -> None:
    with pytest.raises(ValueError):
        replica_name(slot, generation)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("home-0", "home"),
        ("home-0-g2", "home"),
        ("home-eu-12-g7", "home-eu"),
        ("edge-1-2", "edge-1"),
        ("shop", "shop"),
        ("corp-g2", "corp-g2"),  # no slot: no generation, its own group
    ],
)
def test_a_group_is_the_entry_whatever_the_generation(name: str, group: str) -> None:
    assert group_of(name) == group
    assert service_group_of(name) == group  # the discovery service's is the same rule


def test_the_service_counts_a_recycled_replica_in_its_group() -> None:
    assert groups_of(["home-0-g2", "home-1", "corp"]) == ["corp", "home"]


def test_a_new_generation_is_a_new_proxy_id() -> None:
    old, new = (proxy_id("egress-proxies", "dev", n) for n in ("home-0", "home-0-g2"))
    assert old != new


# -- the stack config key ------------------------------------------------------------------------


def cluster(name: str = "cluster") -> dict[str, Any]:
    return {"name": name, "type": "kubernetes", "kubernetes": {"namespace": "egress"}}


def config(keys: Path, generations: Any = None, **extra: Any) -> dict[str, Any]:
    """home (kvm, 2 replicas), eu (gcp, 1), pods (kubernetes, 2), corp-1 (external)."""
    raw = stack_config(
        [unreachable_kvm_provider(keys), gcp_provider(), cluster(), external_provider()],
        [
            proxy("home", "home", replicas=2, where=placement()),
            proxy("eu", "gcp-eu", where=placement("e2-small", "debian", zone="europe-west1-b")),
            proxy("pods", "cluster", replicas=2),
            proxy("corp-1", "corp", url="http://10.0.0.5:3128"),
        ],
    )
    if generations is not None:
        raw["generations"] = generations
    return raw | extra


def errors_of(raw: dict[str, Any], base: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(raw, base)
    return [str(issue) for issue in info.value.issues]


def test_without_the_key_every_replica_is_at_generation_1(tmp_path: Path) -> None:
    parsed = validate(config(tmp_path), tmp_path)
    assert [(r.slot, r.generation, r.name) for r in parsed.replicas()] == [
        ("home-0", 1, "home-0"),
        ("home-1", 1, "home-1"),
        ("eu-0", 1, "eu-0"),
        ("pods-0", 1, "pods-0"),
        ("pods-1", 1, "pods-1"),
        ("corp-1", 1, "corp-1"),
    ]
    assert parsed.generations == {}


def test_a_generation_renames_its_replica_only(tmp_path: Path) -> None:
    parsed = validate(config(tmp_path, {"home-0": 2, "eu-0": 5, "home-1": 1}), tmp_path)
    replicas = {r.slot: r for r in parsed.replicas()}
    assert [r.name for r in replicas.values()] == [
        "home-0-g2",
        "home-1",
        "eu-0-g5",
        "pods-0",
        "pods-1",
        "corp-1",
    ]
    assert (replicas["home-0"].generation, replicas["home-0"].ordinal) == (2, 0)
    assert parsed.warnings == []


def test_every_refused_generation_is_named_by_its_path(tmp_path: Path) -> None:
    generations = {
        "home-0": 0,
        "home-1": "2",
        "eu-0": 2.0,
        "pods-0": True,
        "home-0-g2": 3,
        "home": 2,
        "home-01": 2,
        "homr-0": 2,
        "corp-1": 2,
        "pods-1": 2,
    }
    assert errors_of(config(tmp_path, generations), tmp_path) == [
        "generations.home-0: Input should be greater than or equal to 1 (got 0)",
        "generations.home-1: Input should be a valid integer (got '2')",
        "generations.eu-0: Input should be a valid integer (got 2.0)",
        "generations.pods-0: Input should be a valid integer (got True)",
        "generations.home-0-g2: 'home-0-g2' is generation 2 of 'home-0': a key is a slot, "
        "the replica's generation-1 name ('home-0')",
        "generations.home: no such replica (home has 2: home-0, home-1)",
        "generations.home-01: no such replica (home has 2: home-0, home-1)",
        "generations.homr-0: no such replica: no proxies[] entry 'homr' "
        "(proxies: home, eu, pods, corp-1)",
        "generations.corp-1: 'corp-1' is an external proxy: external proxies are never "
        "recycled (the project did not make them and cannot give them a new address); "
        "take them out of rotation instead",
        "generations.pods-1: 'pods-1' is a kubernetes proxy (provider 'cluster'): a new pod "
        "leaves through its node's address, so a new generation gives no new address; list "
        "'cluster' in autopilot.recycle.egressPerPod only if this cluster gives each pod its "
        "own egress address",
    ]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([{"home-0": 2}], "generations: Input should be a valid dictionary (got [{'home-0': 2}])"),
        (
            {"home-0": 1_000_001},
            "generations.home-0: Input should be less than or equal to 1000000 (got 1000001)",
        ),
        ({3: 2}, "generations.3: not a replica slot such as home-0 (got 3)"),
    ],
)
def test_the_shape_of_the_key(tmp_path: Path, value: Any, error: str) -> None:
    assert errors_of(config(tmp_path, value), tmp_path) == [error]


def test_kubernetes_is_recycled_only_where_the_operator_says_pods_egress_on_their_own(
    tmp_path: Path,
) -> None:
    policy = {"recycle": {"maxAge": "7d", "egressPerPod": ["cluster"]}}
    parsed = validate(config(tmp_path, {"pods-1": 2}, autopilot=policy), tmp_path)
    assert [r.name for r in parsed.replicas() if r.entry.name == "pods"] == ["pods-0", "pods-1-g2"]
    # A broken autopilot block is reported alone: the generation is not judged on it.
    broken = {"recycle": {"maxAge": "soon", "egressPerPod": ["cluster"]}}
    assert errors_of(config(tmp_path, {"pods-1": 2}, autopilot=broken), tmp_path) == [
        "autopilot.recycle.maxAge: not a duration such as 30s, 10m, 1h30m or 2d "
        "(units d, h, m, s) (got 'soon')"
    ]


def test_a_slot_left_by_a_scale_down_warns_and_changes_nothing(tmp_path: Path) -> None:
    parsed = validate(config(tmp_path, {"home-5": 3, "home-0": 2}), tmp_path)
    assert parsed.warnings == [
        "generations.home-5: no such replica now (home has 2): its generation 3 applies "
        "again if home grows back; remove the key otherwise"
    ]
    assert [r.name for r in parsed.replicas() if r.entry.name == "home"] == ["home-0-g2", "home-1"]
    # Grown back to 6, the slot is at its generation again.
    raw = config(tmp_path, {"home-5": 3})
    raw["proxies"][0]["replicas"] = 6
    assert validate(raw, tmp_path).replicas()[5].name == "home-5-g3"


def test_a_generations_name_may_not_be_another_replicas(tmp_path: Path) -> None:
    raw = config(tmp_path, {"home-0": 2})
    raw["proxies"].append(proxy("home-0-g2", "corp", url="http://10.0.0.6:3128"))
    assert errors_of(raw, tmp_path) == [
        "generations.home-0: generation 2 would be named 'home-0-g2', a replica's name already"
    ]


def test_a_broken_entry_hides_no_error_and_adds_none(tmp_path: Path) -> None:
    raw = config(tmp_path, {"home-0": 2, "lost-0": 2})
    raw["proxies"].append({"name": "lost", "provider": "nowhere", "replicas": 2})
    assert errors_of(raw, tmp_path) == [
        "proxies[4].provider: unknown provider 'nowhere' (providers: home, gcp-eu, cluster, corp)"
    ]


# -- the autopilot's view of the stack --------------------------------------------------------


def test_the_autopilot_sees_each_group_with_its_proxies_current_names(tmp_path: Path) -> None:
    parsed = validate(config(tmp_path, {"home-0": 2}), tmp_path)
    made = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    groups = {g.name: g for g in groups_of_stack(parsed, {"home-0-g2": made})}
    assert list(groups) == ["home", "eu", "pods", "corp-1"]
    home = groups["home"]
    assert (home.backend, home.provider, home.replicas) == ("kvm", "home", 2)
    assert home.proxies == (FleetProxy("home-0-g2", made), FleetProxy("home-1", None))
    assert [(p.slot, p.generation) for p in home.proxies] == [("home-0", 2), ("home-1", 1)]
    assert groups["corp-1"].backend == "external"
    assert groups["pods"].backend == "kubernetes"
