"""Each lease rule of discovery/book/rules.py on its own, as a pure function:
what both stores apply (the stores themselves are held to the rules by
tests/integration/test_lease_rules.py)."""

from __future__ import annotations

import pytest

from discovery.book.rules import (
    EVERYWHERE,
    MAX_TARGET_COOLDOWNS,
    Candidate,
    Cooldown,
    LeaseIds,
    ReportEffect,
    available,
    cap_ttl,
    cooldown_scopes,
    cooling_until,
    eligibility,
    eligible,
    fleet_diff,
    is_lease_id,
    merge_cooldown,
    refusal,
    renewal_ttl,
    report_effect,
    round_latency,
)
from discovery.fleet import FleetProxy
from discovery.selection import Selector

NOW = 1000.0


def proxy(name: str = "p0", *, zone: str | None = "z1", **labels: str) -> FleetProxy:
    return FleetProxy(
        name=name,
        id=name,
        provider="kvm",
        type="squid",
        zone=zone,
        host="127.0.0.1",
        port=3128,
        labels=labels,
    )


def free(name: str = "p0") -> Candidate:
    return Candidate(name, healthy=True, leased_until=None, cooling_until=None)


# -- lifetimes -----------------------------------------------------------------------------


def test_a_grant_lasts_what_it_asks_for_never_more_than_the_max() -> None:
    assert cap_ttl(None, 60) == 60
    assert cap_ttl(5, 60) == 5
    assert cap_ttl(600, 60) == 60


def test_a_renewal_lasts_what_it_asks_for_else_the_leases_own_never_more_than_the_max() -> None:
    assert renewal_ttl(None, 20, 60) == 20  # its own, not the max
    assert renewal_ttl(30, 20, 60) == 30  # asked for: longer than its own
    assert renewal_ttl(10, 20, 60) == 10  # or shorter
    assert renewal_ttl(600, 20, 60) == 60
    assert renewal_ttl(None, 120, 60) == 60  # the max was lowered since the grant


# -- cooldowns and reports -----------------------------------------------------------------


def test_a_host_is_kept_away_by_its_own_cooldown_and_the_everywhere_one() -> None:
    assert cooldown_scopes("shop.example") == (EVERYWHERE, "shop.example")
    assert cooldown_scopes(None) == (EVERYWHERE,)
    assert cooldown_scopes("") == (EVERYWHERE,)


def test_cooling_until_is_the_latest_live_cooldown_under_the_scopes() -> None:
    cooldowns = {EVERYWHERE: NOW + 10, "a.example": NOW + 50, "b.example": NOW + 90}
    assert cooling_until(cooldowns, cooldown_scopes("a.example"), NOW) == NOW + 50
    assert cooling_until(cooldowns, cooldown_scopes("c.example"), NOW) == NOW + 10
    assert cooling_until(cooldowns, (), NOW) is None
    # Over at `now` exactly: no longer cooling.
    assert cooling_until({"a.example": NOW}, ("a.example",), NOW) is None
    assert cooling_until({}, cooldown_scopes("a.example"), NOW) is None


def test_blocked_cools_the_proxy_down_for_the_host_or_everywhere() -> None:
    assert report_effect("blocked", "shop.example", 300, NOW) == ReportEffect(
        Cooldown("shop.example", NOW + 300), None
    )
    assert report_effect("blocked", None, 300, NOW) == ReportEffect(
        Cooldown(EVERYWHERE, NOW + 300), None
    )
    assert report_effect("blocked", "shop.example", 0, NOW) == ReportEffect(None, None)


def test_error_counts_as_a_failed_probe_saying_where_and_ok_does_nothing() -> None:
    assert report_effect("error", "shop.example", 300, NOW) == ReportEffect(
        None, "a crawler reported an error for shop.example"
    )
    assert report_effect("error", None, 300, NOW) == ReportEffect(
        None, "a crawler reported an error"
    )
    assert report_effect("ok", "shop.example", 300, NOW) == ReportEffect(None, None)


def test_merge_cooldown_never_shortens_and_widens_past_the_cap() -> None:
    scopes: dict[str, float] = {"old.example": NOW - 1}  # over: does not count
    for i in range(MAX_TARGET_COOLDOWNS):
        assert merge_cooldown(scopes, f"t{i}.example", NOW + 1 + i, NOW) == f"t{i}.example"
    assert merge_cooldown(scopes, "t0.example", NOW - 100, NOW) == "t0.example"  # never shortens
    assert scopes["t0.example"] == NOW + 1
    assert len(scopes) == MAX_TARGET_COOLDOWNS + 1
    assert merge_cooldown(scopes, "last.example", NOW + 100, NOW) == EVERYWHERE
    assert scopes == {EVERYWHERE: NOW + 100}
    assert merge_cooldown(scopes, EVERYWHERE, NOW + 20, NOW) == EVERYWHERE
    assert scopes == {EVERYWHERE: NOW + 100}


# -- eligibility ---------------------------------------------------------------------------


def test_eligibility_carries_the_selector_and_the_hosts_scopes() -> None:
    selector = Selector(zone="z1")
    wanted = eligibility(selector, "shop.example")
    assert wanted.selector is selector
    assert wanted.scopes == (EVERYWHERE, "shop.example")
    assert eligibility(selector, None).scopes == (EVERYWHERE,)


def test_available_is_healthy_and_unleased_whatever_the_cooldowns() -> None:
    assert available(free())
    assert available(Candidate("p0", True, None, NOW + 5))
    assert not available(Candidate("p0", False, None, None))
    assert not available(Candidate("p0", True, NOW + 5, None))


def test_eligible_is_available_not_cooling_and_matched_by_the_selector() -> None:
    anywhere = eligibility(Selector(), None)
    assert eligible(anywhere, proxy(), free())
    assert not eligible(anywhere, proxy(), Candidate("p0", True, None, NOW + 5))
    assert not eligible(anywhere, proxy(), Candidate("p0", False, None, None))
    assert not eligible(anywhere, proxy(), Candidate("p0", True, NOW + 5, None))
    in_z1 = eligibility(Selector(zone="z1", labels={"site": "home"}), None)
    assert eligible(in_z1, proxy(site="home", tier="1"), free())
    assert not eligible(in_z1, proxy(zone="z2", site="home"), free())
    assert not eligible(in_z1, proxy(site="office"), free())


# -- refusals ------------------------------------------------------------------------------


def test_a_refusal_says_no_match_when_the_selector_matches_nothing() -> None:
    denial = refusal([], None, NOW, 5)
    assert (denial.reason, denial.retry_after) == ("no_match", 5)


def test_a_refusal_says_leased_and_when_the_first_lease_ends() -> None:
    denial = refusal(
        [Candidate("a", True, NOW + 30, None), Candidate("b", True, NOW + 20.2, None)],
        None,
        NOW,
        5,
    )
    assert (denial.reason, denial.retry_after) == ("leased", 21)  # rounded up
    assert denial.detail == "2 matching proxies: 2 leased, 0 cooling down, 0 not healthy"


def test_a_refusal_says_cooldown_when_a_free_proxy_cools_down_for_the_host() -> None:
    denial = refusal(
        [Candidate("a", True, None, NOW + 100), Candidate("b", True, NOW + 300, None)],
        "shop.example",
        NOW,
        5,
    )
    assert (denial.reason, denial.retry_after) == ("cooldown", 100)
    assert "1 cooling down for shop.example" in denial.detail


def test_a_refusal_says_unhealthy_and_the_next_probe_when_none_is_healthy() -> None:
    denial = refusal(
        [Candidate("a", False, None, None), Candidate("b", False, NOW + 1, None)], None, NOW, 5
    )
    assert (denial.reason, denial.retry_after) == ("unhealthy", 5)
    # Leased and cooling: free at the later of both.
    later = refusal([Candidate("a", True, NOW + 30, NOW + 100)], "x.example", NOW, 5)
    assert (later.reason, later.retry_after) == ("leased", 100)


# -- ids, fleets, latencies ----------------------------------------------------------------


def test_lease_ids_are_unguessable_and_recognised() -> None:
    new_id = LeaseIds()
    ids = {new_id() for _ in range(1000)}  # more than one 4 KiB pool's worth
    assert len(ids) == 1000
    assert all(is_lease_id(i) for i in ids)
    for text in ("", "x" * 21, "x" * 23, "a\x00" * 11, "é" * 22, "a+b/" * 5 + "ab"):
        assert not is_lease_id(text), text


def test_fleet_diff_names_added_removed_and_changed() -> None:
    diff = fleet_diff({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 20, "d": 4})
    assert (diff.added, diff.removed, diff.changed) == (["d"], ["c"], ["b"])


@pytest.mark.parametrize(("ms", "shown"), [(12.345678, 12.346), (None, None), (3.0, 3.0)])
def test_latency_is_shown_to_the_microsecond(ms: float | None, shown: float | None) -> None:
    assert round_latency(ms) == shown
