"""Several fleet sources as one (discovery/sources.py), on files and a clock
the test moves: names qualified by stack only when there are several, each
source read on its own schedule, a broken one keeping its last good fleet
and reported once per content."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from discovery.fleet import FleetError, FleetSource
from discovery.sources import FleetSources
from tests.support.discovery import proxy_entry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_stack(path: Path, stack: str, names: list[str]) -> None:
    document = {
        "version": 1,
        "project": "egress-proxies",
        "stack": stack,
        "proxies": [proxy_entry(n, port=4000 + i) for i, n in enumerate(names)],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


def sources(clock: Clock, *paths: Path, poll: float = 5.0) -> FleetSources:
    return FleetSources(
        [FleetSource(path=p) for p in paths], file_poll=poll, stack_refresh=60, clock=clock
    )


def test_one_source_keeps_its_names_several_are_qualified_by_stack(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "site-a", ["home-0"])
    write_stack(b, "site-b", ["home-0", "home-1"])
    assert list(sources(Clock(), a).load().proxies) == ["home-0"]
    fleet = sources(Clock(), a, b).load()
    assert list(fleet.proxies) == ["site-a/home-0", "site-b/home-0", "site-b/home-1"]
    assert fleet.proxies["site-b/home-1"].name == "site-b/home-1"
    assert fleet.proxies["site-b/home-1"].port == 4001
    assert (fleet.project, fleet.stack) == ("egress-proxies", "site-a,site-b")


def test_each_source_is_read_when_its_period_has_passed_and_it_changed(tmp_path: Path) -> None:
    clock = Clock()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "site-a", ["home-0"])
    write_stack(b, "site-b", ["home-0"])
    both = sources(clock, a, b, poll=5)
    both.load()
    write_stack(b, "site-b", ["home-0", "home-1"])
    assert not both.due()  # changed, but not looked at before its period
    clock.now += 5
    assert both.due()
    result = both.reload()
    assert "site-b/home-1" in result.fleet.proxies and result.errors == []
    assert not both.due()  # read: nothing new until it changes again


def test_a_broken_source_keeps_its_fleet_and_is_reported_once_per_content(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "site-a", ["home-0"])
    write_stack(b, "site-b", ["home-0"])
    both = sources(clock, a, b, poll=1)
    both.load()
    a.write_text("{")
    write_stack(b, "site-b", ["home-0", "home-1"])
    clock.now += 1
    first = both.reload()
    assert set(first.fleet.proxies) == {"site-a/home-0", "site-b/home-0", "site-b/home-1"}
    [error] = first.new_errors
    assert str(error).startswith(f"file {a}: {a}: not JSON")
    assert first.errors == [str(error)]
    clock.now += 1
    again = both.reload()
    assert again.new_errors == [] and again.errors == first.errors  # the same content
    assert [str(e) for e in both.reload(forced=True).new_errors] == [str(error)]  # SIGHUP
    a.write_text("[")  # broken another way: reported
    clock.now += 1
    assert len(both.reload().new_errors) == 1
    write_stack(a, "site-a", ["home-2"])
    clock.now += 1
    fixed = both.reload()
    assert fixed.errors == [] and fixed.recovered == [f"file {a}"]
    assert "site-a/home-2" in fixed.fleet.proxies and "site-a/home-0" not in fixed.fleet.proxies


def test_a_break_after_a_recovery_is_reported_again_even_with_the_same_content(
    tmp_path: Path,
) -> None:
    """Issue 43, item 6: the same broken content as the last reported break,
    once the source was readable in between, is a new break (the service
    logs and counts each one reported, service.py)."""
    clock = Clock()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "site-a", ["home-0"])
    write_stack(b, "site-b", ["home-0"])
    both = sources(clock, a, b, poll=1)
    both.load()
    errors = []
    for _ in range(2):
        a.write_text("{")
        clock.now += 1
        broken = both.reload()
        assert [str(e) for e in broken.new_errors] == broken.errors  # reported: a new break
        errors.append(broken.errors)
        write_stack(a, "site-a", ["home-0"])
        clock.now += 1
        assert both.reload().recovered == [f"file {a}"]
    assert len(errors[0]) == 1 and errors[1] == errors[0]  # the same content both times


def test_two_sources_of_one_stack_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "prod", ["x"])
    write_stack(b, "prod", ["y"])
    with pytest.raises(FleetError, match=r"are both fleets of stack 'prod'"):
        sources(Clock(), a, b).load()


def test_at_start_every_source_must_be_readable(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "site-a", ["x"])
    with pytest.raises(FleetError, match=f"file {b}: cannot read"):
        sources(Clock(), a, b).load()
