"""proxyinfra/rollout.py: how many replicas of a group a change takes down
at once, which replica waits for which, and the config key that says so
(`proxies[].maxUnavailable`, validated with the rest). The engine's side,
through the real CLI: tests/engine/test_cli_rollout.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxyinfra.config import StackConfig
from proxyinfra.rollout import max_unavailable, predecessors
from proxyinfra.validation import ConfigError, validate
from tests.support.stack_config import (
    external_provider,
    gcp_provider,
    placement,
    proxy,
    stack_config,
    unreachable_kvm_provider,
)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return tmp_path


def good_config(keys: Path) -> dict[str, Any]:
    """A kvm group `home` of two replicas (the provider writes its key files)."""
    home = proxy("home", "home", replicas=2, where=placement())
    return stack_config([unreachable_kvm_provider(keys)], [home])


def every_backend(keys: Path) -> dict[str, Any]:
    raw = good_config(keys)
    raw["providers"] += [
        external_provider(),
        gcp_provider(),
        {"name": "cluster", "type": "kubernetes", "kubernetes": {}},
    ]
    raw["proxies"] += [
        proxy("corp-1", "corp", url="http://10.0.0.5:3128"),
        proxy(
            "eu", "gcp-eu", replicas=2, where=placement("e2-small", "debian", zone="europe-west1-b")
        ),
        proxy("pods", "cluster", replicas=2),
    ]
    return raw


def with_group(keys: Path, replicas: int, value: Any = None) -> StackConfig:
    raw = good_config(keys)
    raw["proxies"][0]["replicas"] = replicas
    if value is not None:
        raw["proxies"][0]["maxUnavailable"] = value
    return validate(raw, keys)


@pytest.mark.parametrize(
    ("replicas", "value", "step"),
    [
        (1, None, 1),
        (2, None, 1),  # 25 % of two, rounded up
        (4, None, 1),
        (5, None, 2),
        (8, None, 2),
        (400, None, 100),
        (8, 3, 3),
        (8, "50%", 4),
        (3, "1%", 1),
        (6, "100%", 6),
        (2, 5, 5),  # more than the group: the whole group at once
    ],
)
def test_max_unavailable(keys: Path, replicas: int, value: Any, step: int) -> None:
    config = with_group(keys, replicas, value)
    assert max_unavailable(config.proxies[0]) == step


def test_each_replica_waits_for_the_one_max_unavailable_before_it_in_its_group(
    keys: Path,
) -> None:
    raw = good_config(keys)
    raw["proxies"][0] |= {"replicas": 5, "maxUnavailable": 2}
    raw["proxies"].append(dict(raw["proxies"][0], name="more", replicas=2, maxUnavailable=1))
    raw["generations"] = {"home-1": 3}
    config = validate(raw, keys)
    assert predecessors(config.replicas()) == {
        "home-2": "home-0",
        "home-3": "home-1-g3",  # the predecessor's current generation
        "home-4": "home-2",
        "more-1": "more-0",  # groups wait within themselves only
    }


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, "Input should be greater than or equal to 1"),
        (1001, "Input should be less than or equal to 1000"),
        ("0%", "not a count (1-1000) or a percentage of the replicas (1%-100%)"),
        ("101%", "not a count (1-1000) or a percentage of the replicas (1%-100%)"),
        ("half", "not a count (1-1000) or a percentage of the replicas (1%-100%)"),
        ("1.5", "Input should be a valid integer"),
    ],
)
def test_a_bad_max_unavailable_is_named_by_its_path(keys: Path, value: Any, problem: str) -> None:
    raw = good_config(keys)
    raw["proxies"][0]["maxUnavailable"] = value
    with pytest.raises(ConfigError) as info:
        validate(raw, keys)
    assert "proxies[0].maxUnavailable" in str(info.value)
    assert problem in str(info.value)


def test_max_unavailable_is_refused_where_replacements_do_not_take_proxies_down(
    keys: Path,
) -> None:
    raw = every_backend(keys)
    for entry in raw["proxies"]:
        entry["maxUnavailable"] = 1
    with pytest.raises(ConfigError) as info:
        validate(raw, keys)
    paths = [line.split(":")[0].strip() for line in str(info.value).splitlines()[1:]]
    refused = [path for path in paths if path.endswith(".maxUnavailable")]
    # external proxies are not replaced; a kubernetes Deployment rolls on its own.
    assert refused == ["proxies[1].maxUnavailable", "proxies[3].maxUnavailable"]
    assert "not used by kubernetes proxies" in str(info.value)
