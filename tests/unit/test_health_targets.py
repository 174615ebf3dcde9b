"""Several probe targets, and a target that is down told from a fleet that is
(health/targets.py), through the engine with a fake probe on a virtual clock."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from health.engine import HealthEngine
from health.model import Health, Outcome, ProxyEndpoint
from health.probe import ProbeResult
from health.targets import DOWN_SHARE, MIN_ATTEMPTS, ProbeTargets, missed_target
from tests.support.virtual_clock import run_virtual

A, B = "a.example:443", "b.example:443"
INTERVAL = 10.0
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(3600):
            return await coro

    return run_virtual(bounded())


def ok() -> ProbeResult:
    return ProbeResult(Outcome.OK, 1.0, 1.0, None, 200, None)


def upstream() -> ProbeResult:
    return ProbeResult(Outcome.UPSTREAM, 1.0, 1.0, None, 503, "503 Service Unavailable")


def refused() -> ProbeResult:
    return ProbeResult(Outcome.REFUSED, None, None, None, None, "connection refused")


@dataclass
class Targets:
    """A fake probe: each target answers what `answers` says for it (a
    proxy's own entry first), and every attempt is recorded."""

    answers: dict[str, ProbeResult] = field(default_factory=dict)
    attempts: list[tuple[str, str]] = field(default_factory=list)

    async def __call__(self, endpoint: ProxyEndpoint, target: str, **_: Any) -> ProbeResult:
        self.attempts.append((endpoint.name, target))
        await asyncio.sleep(0.01)
        return self.answers.get(f"{endpoint.name}@{target}", self.answers.get(target, ok()))


def fleet(count: int) -> list[ProxyEndpoint]:
    return [ProxyEndpoint(f"p{i}", "127.0.0.1", 3128 + i) for i in range(count)]


def engine(fake: Targets, targets: tuple[str, ...], **options: Any) -> HealthEngine:
    return HealthEngine(target=targets, interval=INTERVAL, probe_fn=fake, **options)


def states(eng: HealthEngine) -> Counter[Health]:
    return Counter(p.health for p in eng.all())


async def for_intervals(eng: HealthEngine, count: float) -> None:
    await asyncio.sleep(count * INTERVAL)


async def running(eng: HealthEngine, body: Callable[[], Awaitable[T]]) -> T:
    await eng.start()
    try:
        return await body()
    finally:
        await eng.stop()


def down_gauge(eng: HealthEngine, target: str) -> float | None:
    return eng.registry.get_sample_value("egress_health_probe_target_down", {"target": target})


# --- what says a target was missed ----------------------------------------------------


@pytest.mark.parametrize(
    ("result", "missed"),
    [
        (upstream(), True),
        (ProbeResult(Outcome.TLS, 1.0, 1.0, None, 200, "handshake failed"), True),
        # squid took the connection and is still trying the target
        (ProbeResult(Outcome.TIMEOUT, 1.0, None, None, None, "no answer"), True),
        # the tunnel made, the target's TLS handshake never finished
        (ProbeResult(Outcome.TIMEOUT, 1.0, 1.0, None, 200, "no TLS handshake"), True),
        # the proxy itself never took the connection
        (ProbeResult(Outcome.TIMEOUT, None, None, None, None, "no connect"), False),
        (refused(), False),
        (ProbeResult(Outcome.DENIED, 1.0, 1.0, None, 403, "403"), False),
        (ProbeResult(Outcome.AUTH_REQUIRED, 1.0, 1.0, None, 407, "407"), False),
        (ok(), False),
    ],
    ids=lambda v: v.outcome.value if isinstance(v, ProbeResult) else str(v),
)
def test_what_misses_a_target(result: ProbeResult, missed: bool) -> None:
    assert missed_target(result) is missed


def test_targets_are_checked_and_named() -> None:
    with pytest.raises(ValueError, match="at least one probe target"):
        ProbeTargets((), 10.0)
    with pytest.raises(ValueError, match=r"probe target 'a.example:443' is given twice"):
        ProbeTargets((A, B, A), 10.0)
    with pytest.raises(ValueError, match=r"probe target 'nohostport' is not host:port"):
        HealthEngine(target=(A, "nohostport"), probe_fn=Targets())


# --- fallback ---------------------------------------------------------------------------


def test_a_proxy_that_cannot_reach_the_first_target_is_healthy_through_the_next() -> None:
    fake = Targets({"p0@" + A: upstream()})
    eng = engine(fake, (A, B), fail_threshold=1)
    eng.set_fleet(fleet(2))

    async def body() -> list[Health]:
        return [(await eng.probe_now(name)).health for name in ("p0", "p1")]

    assert run(body()) == [Health.HEALTHY, Health.HEALTHY]
    # p0 tried A, then B; p1 was done at A.
    assert fake.attempts == [("p0", A), ("p0", B), ("p1", A)]


def test_a_proxy_failing_for_itself_is_not_tried_at_the_next_target() -> None:
    fake = Targets({"p0@" + A: refused()})
    eng = engine(fake, (A, B), fail_threshold=1)
    eng.set_fleet(fleet(1))
    state = run(eng.probe_now("p0"))
    assert state.health is Health.UNHEALTHY
    assert state.last_error == "refused: connection refused"
    assert fake.attempts == [("p0", A)]


def test_a_proxy_reaching_no_target_is_unhealthy_with_the_first_targets_answer() -> None:
    fake = Targets({A: upstream(), B: ProbeResult(Outcome.TLS, 1, 1, None, 200, "bad cert")})
    eng = engine(fake, (A, B), fail_threshold=1)
    eng.set_fleet(fleet(1))
    state = run(eng.probe_now("p0"))
    assert state.health is Health.UNHEALTHY
    assert state.last_error == "upstream: 503 Service Unavailable"


# --- a target down across the fleet -------------------------------------------------------


def test_the_only_target_down_leaves_the_fleet_as_it_was_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = Targets()
    eng = engine(fake, (A,))
    eng.set_fleet(fleet(20))

    async def body() -> tuple[Counter[Health], float | None, Counter[Health], float | None]:
        await for_intervals(eng, 2)
        assert states(eng) == Counter({Health.HEALTHY: 20})
        fake.answers[A] = upstream()  # the target's outage
        await for_intervals(eng, 5)
        during = states(eng), down_gauge(eng, A)
        del fake.answers[A]
        await for_intervals(eng, 2)
        return (*during, states(eng), down_gauge(eng, A))

    with caplog.at_level(logging.INFO, logger="health"):
        during, gauge_during, after, gauge_after = run(running(eng, body))
    # Not a proxy lost: the first interval's few failures (before the window
    # filled) are single ones, and two in a row are needed.
    assert during == Counter({Health.HEALTHY: 20})
    assert gauge_during == 1.0 and gauge_after == 0.0
    assert after == Counter({Health.HEALTHY: 20})
    not_counted = eng.registry.get_sample_value("egress_health_probes_targets_down_total")
    assert not_counted is not None and not_counted >= 4 * 20
    said = [r.getMessage() for r in caplog.records if "probe target" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0].startswith(f"probe target {A} looks down: ")
    assert "(503 Service Unavailable)" in said[0]
    assert said[1].startswith(f"probe target {A} reachable again")


def test_a_few_proxies_that_cannot_reach_the_target_are_unhealthy() -> None:
    # 2 of 20 cut off: the target is reached by the rest, so it is not down.
    fake = Targets({"p0@" + A: upstream(), "p1@" + A: upstream()})
    eng = engine(fake, (A,))
    eng.set_fleet(fleet(20))

    async def body() -> Counter[Health]:
        await for_intervals(eng, 4)
        return states(eng)

    assert run(running(eng, body)) == Counter({Health.HEALTHY: 18, Health.UNHEALTHY: 2})
    assert down_gauge(eng, A) == 0.0
    assert {p.name for p in eng.all() if p.health is Health.UNHEALTHY} == {"p0", "p1"}


def test_a_fleet_too_small_to_tell_counts_its_failures() -> None:
    # Fewer attempts in any window than MIN_ATTEMPTS, even in the first
    # interval, where a proxy's probes can fall three in one window (at once,
    # at a random point of the interval, and a period after that one, which
    # may come before the interval has passed): no judgement of the target.
    size = (MIN_ATTEMPTS - 1) // 3
    fake = Targets({A: upstream()})
    eng = engine(fake, (A,))
    eng.set_fleet(fleet(size))

    async def body() -> Counter[Health]:
        await for_intervals(eng, 4)
        return states(eng)

    assert run(running(eng, body)) == Counter({Health.UNHEALTHY: size})
    assert down_gauge(eng, A) == 0.0


def test_crawler_errors_still_count_while_the_target_is_down() -> None:
    fake = Targets({A: upstream()})
    eng = engine(fake, (A,))
    eng.set_fleet(fleet(20))

    async def body() -> Health | None:
        await for_intervals(eng, 3)
        assert down_gauge(eng, A) == 1.0
        eng.report_error("p3", "connection reset")
        eng.report_error("p3", "connection reset")
        return eng.verdict("p3")

    assert run(running(eng, body)) is Health.UNHEALTHY


async def tried_once_a_is_down(eng: HealthEngine, fake: Targets) -> Counter[str]:
    """Three intervals for A to be judged down (B up), then the targets the
    probes of the next four intervals tried."""
    await for_intervals(eng, 3)
    assert down_gauge(eng, A) == 1.0 and down_gauge(eng, B) == 0.0
    fake.attempts.clear()
    await for_intervals(eng, 4)
    return Counter(target for _, target in fake.attempts)


def test_a_down_target_is_tried_after_the_others_and_again_each_interval() -> None:
    fake = Targets({A: upstream()})
    eng = engine(fake, (A, B))
    eng.set_fleet(fleet(40))

    tried = run(running(eng, lambda: tried_once_a_is_down(eng, fake)))
    assert states(eng) == Counter({Health.HEALTHY: 40})
    # Every probe reached B; A was tried first only while its window held
    # too few attempts to judge it again: about MIN_ATTEMPTS an interval, not 40.
    assert tried[B] >= 4 * 40 * 0.85
    assert MIN_ATTEMPTS <= tried[A] <= 4 * (MIN_ATTEMPTS + 3)


@dataclass
class Blackhole(Targets):
    """A's packets dropped: each attempt there waits out the timeout."""

    async def __call__(self, endpoint: ProxyEndpoint, target: str, **options: Any) -> ProbeResult:
        if target != A:
            return await super().__call__(endpoint, target, **options)
        self.attempts.append((endpoint.name, target))
        await asyncio.sleep(options["timeout"])
        return ProbeResult(Outcome.TIMEOUT, 1.0, None, None, None, "no answer in 5 s")


def test_a_target_that_never_answers_holds_only_a_few_probes_as_trials() -> None:
    # 200 proxies: 20 probes start a second. Each trial at A lasts the whole
    # 5 s timeout; without its trials in flight counted, every probe starting
    # meanwhile would try A first too (about 100 per trial period).
    fake = Blackhole()
    eng = engine(fake, (A, B), timeout=5.0)
    eng.set_fleet(fleet(200))

    tried = run(running(eng, lambda: tried_once_a_is_down(eng, fake)))
    assert states(eng) == Counter({Health.HEALTHY: 200})
    assert tried[A] <= 4 * 2 * MIN_ATTEMPTS, tried


def test_a_down_target_back_is_tried_first_again() -> None:
    fake = Targets({A: upstream()})
    eng = engine(fake, (A, B))
    eng.set_fleet(fleet(40))

    async def body() -> Counter[str]:
        await for_intervals(eng, 3)
        assert down_gauge(eng, A) == 1.0
        del fake.answers[A]
        await for_intervals(eng, 2)
        fake.attempts.clear()
        await for_intervals(eng, 2)
        return Counter(target for _, target in fake.attempts)

    tried = run(running(eng, body))
    assert down_gauge(eng, A) == 0.0
    assert tried[B] == 0 and tried[A] >= 2 * 40 * 0.85


def test_the_share_that_makes_a_target_down() -> None:
    targets = ProbeTargets((A,), 10.0)
    for i in range(6):
        targets.record(A, 1.0 + i / 1000, reached=True)
    for i in range(50):
        targets.record(A, 2.0 + i / 1000, reached=False)
    assert DOWN_SHARE > 50 / 56 and not targets.is_down(A)
    for _ in range(4):
        targets.record(A, 3.0, reached=False)
    assert DOWN_SHARE <= 54 / 60 and targets.is_down(A)
    assert targets.order(3.5)[0] == [A]  # the only one: tried, down or not
    # A window later, the old attempts are gone: A's judgement needs
    # MIN_ATTEMPTS new ones, and meanwhile A goes first of the targets.
    both = ProbeTargets((A, B), 10.0)
    for _ in range(MIN_ATTEMPTS):
        both.record(A, 1.0, reached=False)
    assert both.is_down(A) and both.order(5.0) == ([B, A], [])
    # A window later A goes first, as a trial, but only MIN_ATTEMPTS probes at
    # once: the others meanwhile go to B first.
    trials = [both.order(11.5) for _ in range(MIN_ATTEMPTS)]
    assert trials == [([A, B], [A])] * MIN_ATTEMPTS
    assert both.order(11.5) == ([B, A], [])
    both.end_trials([A])
    assert both.order(11.5) == ([A, B], [A])
