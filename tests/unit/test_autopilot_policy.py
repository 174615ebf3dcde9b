"""The autopilot's policy (`egress-proxies:autopilot`): parsed with the rest
of the stack config, every bad key or value refused with its path before
anything runs (docs/autopilot.md, "Policy")."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from proxyinfra.autopilot.policy import format_duration, parse_duration
from proxyinfra.validation import ConfigError, validate
from tests.support.stack_config import (
    external_provider,
    proxy,
    stack_config,
    unreachable_kvm_provider,
)


def config(tmp_path: Path, autopilot: Any) -> dict[str, Any]:
    """A kvm group `home`, an external `corp-1`, a kubernetes group `pods`."""
    providers = [
        unreachable_kvm_provider(tmp_path),
        external_provider("corp"),
        {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress"}},
    ]
    proxies = [
        proxy("home", "home", replicas=2, where={"machineType": "s", "image": "d"}),
        proxy("corp-1", "corp", url="http://10.0.0.5:3128"),
        proxy("pods", "cluster"),
    ]
    return stack_config(providers, proxies) | {"autopilot": autopilot}


def policy(**overrides: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "recycle": {"bannedSites": 3, "window": "10m"},
        "scale": {"groups": {"home": {"min": 2, "max": 4}}},
    }
    return block | overrides


def errors_of(raw: dict[str, Any], base: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(raw, base)
    return [str(issue) for issue in info.value.issues]


def test_the_contract_keys_and_the_defaults(tmp_path: Path) -> None:
    parsed = validate(config(tmp_path, policy()), tmp_path).autopilot
    assert parsed is not None and parsed.recycle is not None and parsed.scale is not None
    assert parsed.recycle.banned_sites == 3
    assert parsed.recycle.window == timedelta(minutes=10)
    assert (parsed.recycle.max_age, parsed.recycle.healthy_floor) == (None, 1)
    assert parsed.recycle.egress_per_pod == []
    bounds = parsed.scale.groups["home"]
    assert (bounds.min, bounds.max) == (2, 4)
    assert (parsed.scale.unmet_per_minute, parsed.scale.step) == (1.0, 1)
    assert parsed.scale.idle_after == timedelta(minutes=15)
    assert parsed.scale.settle == timedelta(minutes=15)
    assert parsed.max_changes_per_round == 2


def test_no_block_no_policy(tmp_path: Path) -> None:
    raw = config(tmp_path, {})
    del raw["autopilot"]
    assert validate(raw, tmp_path).autopilot is None


def test_every_key_written_out(tmp_path: Path) -> None:
    block = {
        "recycle": {
            "bannedSites": 5,
            "window": "1h30m",
            "maxAge": "2d",
            "healthyFloor": 0,
            "egressPerPod": ["cluster"],
        },
        "scale": {
            "groups": {"home": {"min": 1, "max": 1}, "pods": {"min": 1, "max": 3}},
            "unmetPerMinute": 0.5,
            "step": 2,
            "idleAfter": "30m",
            "settle": "90s",
        },
        "maxChangesPerRound": 7,
    }
    parsed = validate(config(tmp_path, block), tmp_path).autopilot
    assert parsed is not None and parsed.recycle is not None and parsed.scale is not None
    assert parsed.recycle.window == timedelta(hours=1, minutes=30)
    assert parsed.recycle.max_age == timedelta(days=2)
    assert parsed.recycle.egress_per_pod == ["cluster"]
    assert parsed.scale.settle == timedelta(seconds=90)
    assert parsed.max_changes_per_round == 7


@pytest.mark.parametrize(
    ("text", "seconds", "shown"),
    [
        ("30s", 30, "30s"),
        ("10m", 600, "10m"),
        ("1h30m", 5400, "1h30m"),
        ("2d", 172800, "2d"),
        ("90s", 90, "1m30s"),
        ("1d1s", 86401, "1d1s"),
    ],
)
def test_durations(text: str, seconds: int, shown: str) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert format_duration(parse_duration(text)) == shown


def test_bad_durations_are_named_by_path(tmp_path: Path) -> None:
    block = policy(recycle={"bannedSites": 3, "window": "10 minutes", "maxAge": 600})
    block["scale"] |= {"idleAfter": "0m", "settle": "-5m"}
    words = "not a duration such as 30s, 10m, 1h30m or 2d (units d, h, m, s)"
    assert errors_of(config(tmp_path, block), tmp_path) == [
        f"autopilot.recycle.window: {words} (got '10 minutes')",
        f"autopilot.recycle.maxAge: {words} (got 600)",
        "autopilot.scale.idleAfter: must be longer than 0s (got '0m')",
        f"autopilot.scale.settle: {words} (got '-5m')",
    ]


def test_the_window_is_one_the_service_counts_over(tmp_path: Path) -> None:
    block = policy(recycle={"bannedSites": 3, "window": "1d1s"})
    assert errors_of(config(tmp_path, block), tmp_path) == [
        "autopilot.recycle.window: at most 1d: the discovery service counts signals over 24h "
        "at most (got '1d1s')"
    ]


def test_negative_and_zero_values_are_refused(tmp_path: Path) -> None:
    block = {
        "recycle": {"bannedSites": 0, "healthyFloor": -1},
        "scale": {
            "groups": {"home": {"min": -1, "max": 0}},
            "unmetPerMinute": 0,
            "step": -2,
        },
        "maxChangesPerRound": 0,
    }
    errors = errors_of(config(tmp_path, block), tmp_path)
    assert [e.split(":")[0] for e in errors] == [
        "autopilot.recycle.bannedSites",
        "autopilot.recycle.healthyFloor",
        "autopilot.scale.groups.home.min",
        "autopilot.scale.groups.home.max",
        "autopilot.scale.unmetPerMinute",
        "autopilot.scale.step",
        "autopilot.maxChangesPerRound",
    ]
    assert (
        errors[0]
        == "autopilot.recycle.bannedSites: Input should be greater than or equal to 1 (got 0)"
    )
    assert errors[1].endswith("greater than or equal to 0 (got -1)")


def test_min_above_max_is_refused(tmp_path: Path) -> None:
    block = policy(scale={"groups": {"home": {"min": 5, "max": 3}}})
    assert errors_of(config(tmp_path, block), tmp_path) == [
        "autopilot.scale.groups.home.min: greater than max (3) (got 5)"
    ]


def test_unknown_keys_are_named_with_the_allowed_ones(tmp_path: Path) -> None:
    block = policy(recycle={"bannedSite": 3}, maxChanges=2)
    block["scale"]["groups"]["home"]["maximum"] = 4
    errors = errors_of(config(tmp_path, block), tmp_path)
    assert errors == [
        "autopilot.recycle.bannedSite: unknown key (allowed: bannedSites, egressPerPod, "
        "healthyFloor, maxAge, unhealthyFor, window); did you mean 'bannedSites'?",
        "autopilot.scale.groups.home.maximum: unknown key (allowed: max, min); did you mean 'max'?",
        "autopilot.maxChanges: unknown key (allowed: maxChangesPerRound, recycle, scale); did "
        "you mean 'maxChangesPerRound'?",
    ]


def test_groups_are_provisioned_proxies_entries(tmp_path: Path) -> None:
    block = policy(
        scale={
            "groups": {
                "home": {"min": 1, "max": 2},
                "nope": {"min": 1, "max": 2},
                "corp-1": {"min": 1, "max": 2},
            }
        }
    )
    assert errors_of(config(tmp_path, block), tmp_path) == [
        "autopilot.scale.groups.nope: unknown proxies[] entry 'nope' (proxies: home, corp-1, pods)",
        "autopilot.scale.groups.corp-1: 'corp-1' is on external provider 'corp', whose proxies "
        "have no replicas to scale",
    ]


def test_a_broken_entry_is_not_called_unknown_as_well(tmp_path: Path) -> None:
    raw = config(tmp_path, policy())
    raw["proxies"][0]["replicas"] = "many"
    errors = errors_of(raw, tmp_path)
    assert len(errors) == 1 and errors[0].startswith("proxies[0].replicas:")


def test_egress_per_pod_names_kubernetes_providers(tmp_path: Path) -> None:
    block = policy(recycle={"bannedSites": 3, "egressPerPod": ["cluster", "home", "gone"]})
    assert errors_of(config(tmp_path, block), tmp_path) == [
        "autopilot.recycle.egressPerPod[1]: 'home' is a kvm provider; only kubernetes "
        "providers are listed here",
        "autopilot.recycle.egressPerPod[2]: 'gone' is no provider; only kubernetes providers "
        "are listed here",
    ]


def test_a_recycle_block_needs_a_rule(tmp_path: Path) -> None:
    block = policy(recycle={"window": "5m"})
    assert errors_of(config(tmp_path, block), tmp_path) == [
        "autopilot.recycle: nothing to recycle by: set bannedSites, maxAge, unhealthyFor or several"
    ]


def test_unhealthy_for_alone_is_a_rule_and_under_a_boot_is_a_warning(tmp_path: Path) -> None:
    config_ = validate(config(tmp_path, policy(recycle={"unhealthyFor": "30m"})), tmp_path)
    assert config_.autopilot is not None and config_.autopilot.recycle is not None
    assert config_.autopilot.recycle.unhealthy_for == timedelta(minutes=30)
    assert config_.warnings == []
    short = validate(config(tmp_path, policy(recycle={"unhealthyFor": "4m59s"})), tmp_path)
    assert short.warnings == [
        "autopilot.recycle.unhealthyFor is 4m59s, under 5m: a new proxy is unhealthy until it "
        "has booted and squid answers (minutes; more where the boot installs squid), so a "
        "replacement still booting would be replaced again"
    ]
    assert errors_of(config(tmp_path, policy(recycle={"unhealthyFor": "soon"})), tmp_path) == [
        "autopilot.recycle.unhealthyFor: not a duration such as 30s, 10m, 1h30m or 2d "
        "(units d, h, m, s) (got 'soon')"
    ]


def test_policy_errors_come_with_the_others_in_one_message(tmp_path: Path) -> None:
    raw = config(tmp_path, policy(recycle={"bannedSites": 3, "window": "soon"}))
    raw["squid"]["port"] = 0
    errors = errors_of(raw, tmp_path)
    assert [e.split(":")[0] for e in errors] == ["squid.port", "autopilot.recycle.window"]


def test_not_a_mapping(tmp_path: Path) -> None:
    errors = errors_of(config(tmp_path, ["recycle"]), tmp_path)
    assert errors == [
        "autopilot: Input should be a valid dictionary or instance of AutopilotPolicy "
        "(got ['recycle'])"
    ]
