"""What the decision log says a change answers: `evidence` picks, per rule,
the service's figures behind it and the proxy's creation time."""

from __future__ import annotations

from datetime import timedelta

from proxyinfra.autopilot.changes import Recycle, Scale
from proxyinfra.autopilot.signals import GroupSignal, ProxySignal, Signals, evidence
from tests.support.autopilot_plan import MIN, NOW, WINDOW, group

MADE = NOW - timedelta(hours=1)  # what group() gives every proxy


def test_a_ban_recycle_gives_the_sites_the_last_report_and_the_proxy_s_age() -> None:
    signals = Signals(NOW, WINDOW, {"home-1": ProxySignal(True, 4, NOW - MIN)})
    change = Recycle("home", "home-1", "bannedSites", "blocked")
    others = group("eu", made=NOW - timedelta(days=2))  # also made, another time
    assert evidence(change, signals, [others, group("home")]) == {
        "healthy": True,
        "blockedSites": 4,
        "lastBlockedAt": (NOW - MIN).isoformat(),
        "createdAt": MADE.isoformat(),
        "window": 600,
    }


def test_a_proxy_the_service_does_not_know_and_the_stack_does_not_either() -> None:
    change = Recycle("home", "gone-0", "unhealthyFor", "down")
    assert evidence(change, Signals(NOW, WINDOW), [group("home")]) == {
        "healthy": None,
        "unhealthy": None,
        "createdAt": None,
        "window": 600,
    }


def test_a_scale_gives_the_group_s_refused_grants_per_minute() -> None:
    signals = Signals(NOW, WINDOW, groups={"home": GroupSignal(refused=15, leased=2)})
    change = Scale("home", 2, 3, "demand", "busy")
    assert evidence(change, signals, [group("home")]) == {
        "replicas": 2,
        "window": 600,
        "refused": 15,
        "perMinute": 1.5,
        "leased": 2,
    }
