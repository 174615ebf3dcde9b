"""The health engine with a fake probe, and the probe's pure parts.

Schedules run on real time with short intervals (tens of milliseconds), so
each test takes well under a second; bounds are checked with a margin that
is small against the interval but survives a busy machine.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import os
import resource
import statistics
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry

from health.engine import TICK_S, HealthEngine
from health.model import HISTORY, Health, Outcome, ProxyEndpoint
from health.probe import (
    MalformedAnswer,
    ProbeResult,
    check_target,
    classify,
    connect_request,
    parse_status,
    probe,
)
from tests.support.virtual_clock import run_virtual

TARGET = "example.com:443"
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """On a controlled clock (tests/support/virtual_clock.py): the loop times
    these tests assert are the ones the engine scheduled, however busy the
    machine."""

    async def bounded() -> T:
        async with asyncio.timeout(10):
            return await coro

    return run_virtual(bounded())


async def eventually(check: Callable[[], bool], within: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(0.002)


def ok(total_ms: float = 1.0) -> ProbeResult:
    return ProbeResult(Outcome.OK, total_ms / 2, total_ms / 2, None, 200, None)


def failed(outcome: Outcome = Outcome.REFUSED) -> ProbeResult:
    return ProbeResult(outcome, None, None, None, None, f"fake {outcome.value}")


@dataclass
class FakeProbe:
    """Answers from a per-proxy script (last entry repeats), records calls
    with their loop time, and measures how many probes run at once."""

    results: dict[str, list[ProbeResult]] = field(default_factory=dict)
    delay: float = 0.0
    calls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    running: int = 0
    most_running: int = 0
    seen: list[tuple[ProxyEndpoint, str, dict[str, Any]]] = field(default_factory=list)

    async def __call__(
        self,
        endpoint: ProxyEndpoint,
        target: str,
        *,
        timeout: float,
        tls: bool,
        ca_file: str | None,
    ) -> ProbeResult:
        self.calls[endpoint.name].append(asyncio.get_running_loop().time())
        self.seen.append((endpoint, target, {"timeout": timeout, "tls": tls, "ca_file": ca_file}))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.running -= 1
        script = self.results.get(endpoint.name, [ok()])
        index = min(len(self.calls[endpoint.name]) - 1, len(script) - 1)
        return script[index]

    def count(self, name: str) -> int:
        return len(self.calls[name])


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, Health]] = []

    def on_health_change(self, name: str, health: Health) -> None:
        self.changes.append((name, health))


def endpoints(*names: str) -> list[ProxyEndpoint]:
    return [ProxyEndpoint(name, "127.0.0.1", 3128) for name in names]


def engine(fake: FakeProbe, **options: Any) -> HealthEngine:
    options.setdefault("target", TARGET)
    options.setdefault("interval", 60.0)
    return HealthEngine(probe_fn=fake, **options)


async def running(eng: HealthEngine, body: Callable[[], Awaitable[None]]) -> None:
    await eng.start()
    try:
        await body()
    finally:
        await eng.stop()


# --- state ------------------------------------------------------------------------


def test_fail_and_ok_thresholds_count_consecutive_results() -> None:
    fake = FakeProbe(
        results={"a": [failed(), ok(), failed(), failed(), failed(), ok(), ok(), failed(), ok()]}
    )
    listener = Recorder()
    eng = engine(fake, fail_threshold=2, ok_threshold=2, listener=listener)
    eng.set_fleet(endpoints("a"))

    async def body() -> list[Health]:
        return [(await eng.probe_now("a")).health for _ in range(9)]

    states = run(body())
    U, H, X = Health.UNKNOWN, Health.HEALTHY, Health.UNHEALTHY
    # One failure is not enough; a success in between restarts the count.
    assert states == [U, U, U, X, X, X, H, H, H]
    assert listener.changes == [("a", X), ("a", H)]


def test_new_proxy_state_error_and_changed_at() -> None:
    fake = FakeProbe(results={"a": [failed(Outcome.AUTH_REQUIRED), ok()]})
    eng = engine(fake, fail_threshold=1)
    eng.set_fleet(endpoints("a"))
    first = eng.health("a")
    assert first is not None
    assert (first.health, first.latency_ms, first.last_error) == (Health.UNKNOWN, None, None)
    assert first.changed_at is not None
    assert eng.verdict("a") is Health.UNKNOWN  # the health alone, as grants ask it

    down = run(eng.probe_now("a"))
    assert down.health is Health.UNHEALTHY
    assert eng.verdict("a") is Health.UNHEALTHY
    assert down.last_error == "auth_required: fake auth_required"
    assert down.changed_at is not None and down.changed_at > first.changed_at

    up = run(eng.probe_now("a"))
    assert up.health is Health.HEALTHY
    assert up.changed_at is not None and up.changed_at > down.changed_at
    # The last error stays visible after recovery: it is the last one seen.
    assert up.last_error == down.last_error
    assert eng.verdict("a") is Health.HEALTHY
    assert eng.health("nope") is None and eng.verdict("nope") is None
    with pytest.raises(KeyError):
        run(eng.probe_now("nope"))


# Every outcome a proxy answers with that is not a tunnel: its own fault.
FAILURES = [o for o in Outcome if o not in (Outcome.OK, Outcome.LOCAL)]


@pytest.mark.parametrize("outcome", FAILURES, ids=[o.value for o in FAILURES])
def test_no_answer_but_a_tunnel_makes_a_proxy_healthy(outcome: Outcome) -> None:
    """407 (stale credentials), 403 (refuses us), 502-504 (broken upstream)
    and every other failure: never healthy, and a healthy proxy falls."""
    fake = FakeProbe(results={"new": [failed(outcome)], "was-ok": [ok(), failed(outcome)]})
    eng = engine(fake, fail_threshold=1, ok_threshold=1)
    eng.set_fleet(endpoints("new", "was-ok"))

    async def body() -> list[Health]:
        return [
            (await eng.probe_now("new")).health,
            (await eng.probe_now("new")).health,
            (await eng.probe_now("was-ok")).health,
            (await eng.probe_now("was-ok")).health,
        ]

    assert run(body()) == [Health.UNHEALTHY] * 2 + [Health.HEALTHY, Health.UNHEALTHY]
    state = eng.health("was-ok")
    assert state is not None and state.last_error == f"{outcome.value}: fake {outcome.value}"


def test_latency_is_an_ewma_of_successful_probes() -> None:
    fake = FakeProbe(results={"a": [ok(10.0), ok(20.0), failed(), ok(0.0)]})
    eng = engine(fake, latency_alpha=0.5, fail_threshold=5)
    eng.set_fleet(endpoints("a"))

    async def body() -> list[float | None]:
        return [(await eng.probe_now("a")).latency_ms for _ in range(4)]

    assert run(body()) == [10.0, 15.0, 15.0, 7.5]


def test_the_recent_probes_are_kept_bounded_failures_as_none() -> None:
    script = [ok(float(n)) for n in range(1, HISTORY + 5)] + [failed(), ok(2.25)]
    fake = FakeProbe(results={"a": script})
    eng = engine(fake, fail_threshold=5)
    eng.set_fleet(endpoints("a"))

    async def body() -> list[tuple[float | None, ...]]:
        return [(await eng.probe_now("a")).recent_ms for _ in range(len(script))]

    seen = run(body())
    assert seen[0] == (1.0,) and seen[2] == (1.0, 2.0, 3.0)
    assert all(len(recent) <= HISTORY for recent in seen)
    assert seen[-1][-3:] == (float(HISTORY + 4), None, 2.2)
    assert len(seen[-1]) == HISTORY
    eng.report_error("a", "a crawler's report is not a probe")
    assert eng.health("a") is not None and eng.health("a").recent_ms == seen[-1]  # type: ignore[union-attr]


def test_crawler_error_report_counts_as_a_failed_probe() -> None:
    listener = Recorder()
    eng = engine(FakeProbe(), fail_threshold=2, listener=listener)
    eng.set_fleet(endpoints("a"))
    run(eng.probe_now("a"))
    eng.report_error("a", "tunnel broke")
    assert eng.health("a").health is Health.HEALTHY  # type: ignore[union-attr]
    eng.report_error("a", "tunnel broke again")
    state = eng.health("a")
    assert state is not None and state.health is Health.UNHEALTHY
    assert state.last_error == "reported by a crawler: tunnel broke again"
    eng.report_error("gone", "x")  # a proxy that left the fleet: ignored
    assert listener.changes == [("a", Health.HEALTHY), ("a", Health.UNHEALTHY)]
    assert eng.registry.get_sample_value("egress_health_reported_errors_total") == 2.0


def test_take_changed_gives_the_proxies_probed_or_reported_since_the_last_call() -> None:
    """What the PostgreSQL prober writes each round: only what changed, not a
    snapshot of the whole fleet (discovery/postgres/prober.py)."""
    eng = engine(FakeProbe(results={"b": [failed()]}))
    eng.set_fleet(endpoints("a", "b", "c"))
    assert eng.take_changed() == []  # added, not probed: nothing learnt yet

    async def body() -> None:
        await eng.probe_now("a")
        await eng.probe_now("b")

    run(body())
    assert [p.name for p in eng.take_changed()] == ["a", "b"]
    assert eng.take_changed() == []  # taken
    eng.report_error("c", "tunnel broke")
    eng.set_fleet(endpoints("a", "b", "c", "d"))
    run(body())
    eng.set_fleet(endpoints("b", "c"))  # a left the fleet after its probe
    changed = eng.take_changed()
    assert [p.name for p in changed] == ["c", "b"]
    assert changed == [eng.health("c"), eng.health("b")]  # as all() gives them


def test_failing_listener_does_not_stop_the_engine() -> None:
    class Broken:
        def on_health_change(self, name: str, health: Health) -> None:
            raise RuntimeError("lease store down")

    eng = engine(FakeProbe(), listener=Broken())
    eng.set_fleet(endpoints("a"))
    assert run(eng.probe_now("a")).health is Health.HEALTHY


def test_crashing_probe_counts_as_an_error() -> None:
    async def crash(endpoint: ProxyEndpoint, target: str, **_: Any) -> ProbeResult:
        raise RuntimeError("bug")

    eng = HealthEngine(target=TARGET, probe_fn=crash, fail_threshold=1)
    eng.set_fleet(endpoints("a"))
    state = run(eng.probe_now("a"))
    assert state.health is Health.UNHEALTHY
    assert state.last_error == "error: probe crashed: RuntimeError('bug')"


def test_the_probers_own_shortage_counts_against_no_proxy(caplog: pytest.LogCaptureFixture) -> None:
    local = ProbeResult(Outcome.LOCAL, None, None, None, None, "no descriptor")
    fake = FakeProbe(results={"a": [ok(), local, local, local, ok()], "b": [local]})
    listener = Recorder()
    eng = engine(fake, fail_threshold=1, listener=listener)
    eng.set_fleet(endpoints("a", "b"))

    async def body() -> tuple[list[Health], list[Health]]:
        a = [(await eng.probe_now("a")).health for _ in range(5)]
        b = [(await eng.probe_now("b")).health for _ in range(3)]
        return a, b

    with caplog.at_level(logging.WARNING, logger="health"):
        a, b = run(body())
    assert a == [Health.HEALTHY] * 5 and b == [Health.UNKNOWN] * 3
    assert listener.changes == [("a", Health.HEALTHY)]
    assert (eng.probe_count("a"), eng.probe_count("b")) == (2, 0)
    assert eng.registry.get_sample_value("egress_health_probes_total", {"outcome": "local"}) == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not run (no descriptor)" in warnings[0], warnings


def test_a_probe_without_a_file_descriptor_is_the_probers_fault() -> None:
    async def body() -> ProbeResult:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fillers: list[int] = []
        # Every descriptor below a lowered limit taken: the next socket() fails with EMFILE.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        try:
            with pytest.raises(OSError) as full:
                while True:
                    fillers.append(os.open(os.devnull, os.O_RDONLY))
            assert full.value.errno == errno.EMFILE
            return await probe(ProxyEndpoint("a", "127.0.0.1", 9), TARGET, timeout=2)
        finally:
            for fd in fillers:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    result = run(body())
    assert result.outcome is Outcome.LOCAL, result
    assert result.error is not None and "Too many open files" in result.error


def test_a_bug_after_the_probe_keeps_the_proxy_on_the_schedule() -> None:
    answers: list[Any] = [None, ok()]  # None: not a ProbeResult, recording it fails

    async def sloppy(endpoint: ProxyEndpoint, target: str, **_: Any) -> Any:
        return answers.pop(0) if answers else ok()

    eng = HealthEngine(target=TARGET, probe_fn=sloppy, interval=0.02)
    eng.set_fleet(endpoints("a"))

    async def body() -> None:
        await eventually(lambda: eng.health("a").health is Health.HEALTHY)  # type: ignore[union-attr]

    run(running(eng, body))


def test_probe_gets_target_and_options() -> None:
    fake = FakeProbe()
    eng = engine(fake, timeout=1.5, tls=True, ca_file="/ca.pem")
    eng.set_fleet([ProxyEndpoint("a", "10.0.0.5", 3128, "u", "p")])
    run(eng.probe_now("a"))
    assert fake.seen == [
        (
            ProxyEndpoint("a", "10.0.0.5", 3128, "u", "p"),
            TARGET,
            {"timeout": 1.5, "tls": True, "ca_file": "/ca.pem"},
        )
    ]


@pytest.mark.parametrize(
    "options",
    [
        {"target": "example.com"},
        {"target": "example.com:443\r\nX: y"},
        {"target": "example.com:0"},
        {"interval": 0},
        {"workers": 0},
        {"timeout": -1},
        {"fail_threshold": 0},
        {"ok_threshold": 0},
        {"jitter": 1.0},
        {"latency_alpha": 0},
    ],
)
def test_bad_settings_are_rejected(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        engine(FakeProbe(), **options)


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="'a' appears twice"):
        engine(FakeProbe()).set_fleet(endpoints("a", "a"))


# --- the fleet over time -------------------------------------------------------------


def test_changing_fleet_added_probed_at_once_removed_not_probed() -> None:
    fake = FakeProbe()
    eng = engine(fake, interval=0.05, jitter=0.0)
    eng.set_fleet(endpoints("a", "b"))

    async def body() -> None:
        loop = asyncio.get_running_loop()
        await eventually(lambda: fake.count("a") >= 3 and fake.count("b") >= 3)
        # Added while running, under a long interval's worth of other work:
        # probed at once, not at the next round.
        added_at = loop.time()
        eng.set_fleet(endpoints("a", "c"))
        await eventually(lambda: fake.count("c") >= 1, within=0.5)
        assert fake.calls["c"][0] - added_at < 1e-9  # at once: the clock is controlled
        assert eng.health("c").health is Health.HEALTHY  # type: ignore[union-attr]
        assert eng.health("b") is None
        # b may have had a probe in flight at removal; after that, none.
        await asyncio.sleep(0.01)
        b_calls = fake.count("b")
        await asyncio.sleep(0.25)  # five intervals
        assert fake.count("b") == b_calls
        assert fake.count("a") >= 5 and fake.count("c") >= 4

    run(running(eng, body))
    assert [p.name for p in eng.all()] == ["a", "c"]


def test_changed_credentials_start_over_unchanged_proxies_keep_state() -> None:
    fake = FakeProbe()
    listener = Recorder()
    eng = engine(fake, listener=listener)
    eng.set_fleet(endpoints("a", "b"))

    async def body() -> None:
        await eventually(lambda: fake.count("a") == 1 and fake.count("b") == 1)
        await eventually(lambda: eng.health("a").health is Health.HEALTHY)  # type: ignore[union-attr]
        before_b = eng.health("b")
        eng.set_fleet([ProxyEndpoint("a", "127.0.0.1", 3128, "crawler", "new"), *endpoints("b")])
        assert eng.health("a").health is Health.UNKNOWN  # type: ignore[union-attr]
        await eventually(lambda: fake.count("a") == 2)
        assert fake.seen[-1][0].password == "new"
        await eventually(lambda: eng.health("a").health is Health.HEALTHY)  # type: ignore[union-attr]
        await asyncio.sleep(0.02)
        assert fake.count("b") == 1  # interval 60 s: not probed again
        assert eng.health("b") == before_b

    run(running(eng, body))
    # a and b became healthy in either order; then a started over.
    assert sorted(listener.changes[:2]) == [("a", Health.HEALTHY), ("b", Health.HEALTHY)]
    assert listener.changes[2:] == [("a", Health.UNKNOWN), ("a", Health.HEALTHY)]


def test_result_of_a_removed_proxy_in_flight_is_dropped() -> None:
    fake = FakeProbe(delay=0.05)
    listener = Recorder()
    eng = engine(fake, workers=1, listener=listener)
    eng.set_fleet(endpoints("a"))

    async def body() -> None:
        await eventually(lambda: fake.running == 1)
        eng.set_fleet(endpoints("b"))
        await eventually(lambda: fake.count("b") == 1)  # the one slot came back
        await eventually(lambda: eng.health("b").health is Health.HEALTHY)  # type: ignore[union-attr]

    run(running(eng, body))
    assert eng.health("a") is None
    assert listener.changes == [("b", Health.HEALTHY)]


def test_every_interval_spread_evenly_with_jitter() -> None:
    fake = FakeProbe()
    interval, jitter, size = 0.3, 0.2, 200
    eng = engine(fake, interval=interval, jitter=jitter)
    names = [f"p{i}" for i in range(size)]
    eng.set_fleet(endpoints(*names))

    async def body() -> None:
        await asyncio.sleep(interval * 3.5)

    run(running(eng, body))
    slack = 1e-9  # the clock is controlled: only float rounding
    tick = min(TICK_S, interval / 100)  # a due probe waits for the others due within it
    start = min(calls[0] for calls in fake.calls.values())
    # Everyone probed at once, then the second probes spread over the interval.
    assert all(fake.calls[n][0] - start < slack for n in names)
    second = [fake.calls[n][1] - fake.calls[n][0] for n in names]
    assert all(0 <= gap <= interval + tick + slack for gap in second)
    quarters = [
        sum(q * interval / 4 <= g < (q + 1) * interval / 4 for g in second) for q in range(4)
    ]
    assert all(count > size / 8 for count in quarters), quarters
    # After that, every interval with jitter: never later than the interval
    # (and a tick), never earlier than interval * (1 - jitter).
    gaps = [
        b - a for n in names for a, b in zip(fake.calls[n][1:], fake.calls[n][2:], strict=False)
    ]
    assert len(gaps) > size
    assert min(gaps) >= interval * (1 - jitter) - slack
    assert max(gaps) <= interval + tick + slack
    assert statistics.pstdev(gaps) > interval * jitter / 10  # the jitter is real


def test_probes_due_within_a_tick_start_on_one_wake_up() -> None:
    """At thousands of probes a second, one wake-up of the loop per probe
    cost more CPU than the probe (bench/health_probes.py): the scheduler
    sleeps a tick past the next due time and starts all that are due then."""
    fake = FakeProbe()
    interval, size = 1.0, 400
    tick = min(TICK_S, interval / 100)
    eng = engine(fake, interval=interval, jitter=0.0)
    names = [f"p{i}" for i in range(size)]
    eng.set_fleet(endpoints(*names))

    async def body() -> None:
        await asyncio.sleep(interval * 2.5)

    run(running(eng, body))
    # The second probes, due at random points of the interval: 400 due times,
    # no more start times than ticks in the interval.
    starts = {fake.calls[n][1] for n in names}
    assert len(starts) <= interval / tick + 1, len(starts)
    # None waits more than a tick: without jitter the period is the interval.
    gaps = [fake.calls[n][2] - fake.calls[n][1] for n in names]
    assert min(gaps) >= interval - 1e-9
    assert max(gaps) <= interval + tick + 1e-9


# --- concurrency ---------------------------------------------------------------------


def test_never_more_probes_in_flight_than_workers() -> None:
    fake = FakeProbe(delay=0.01)
    eng = engine(fake, workers=7, interval=0.02)
    eng.set_fleet(endpoints(*(f"p{i}" for i in range(60))))

    async def body() -> None:
        in_flight = []
        # probe_now shares the bound with scheduled probes.
        extra = [asyncio.create_task(eng.probe_now(f"p{i}")) for i in range(10)]
        for _ in range(100):
            in_flight.append(eng.in_flight)
            await asyncio.sleep(0.002)
        await asyncio.gather(*extra)
        assert max(in_flight) == 7

    run(running(eng, body))
    assert fake.most_running == 7  # reached, never exceeded
    assert sum(map(len, fake.calls.values())) > 60


def test_stop_cancels_probes_and_frees_the_workers() -> None:
    fake = FakeProbe(delay=5.0)
    eng = engine(fake, workers=2)
    eng.set_fleet(endpoints("a", "b", "c"))

    async def body() -> None:
        await eng.start()
        await eventually(lambda: fake.running == 2)
        await eng.stop()
        assert fake.running == 0 and eng.in_flight == 0
        fake.delay = 0.0
        await eng.start()
        # Both slots are free again: all three get probed.
        await eventually(lambda: all(eng.health(n).health is Health.HEALTHY for n in "abc"))  # type: ignore[union-attr]
        await eng.stop()

    run(body())


# --- metrics -------------------------------------------------------------------------


def test_prometheus_metrics_on_the_given_registry() -> None:
    registry = CollectorRegistry()
    fake = FakeProbe(results={"b": [failed(Outcome.TIMEOUT)]})
    eng = engine(fake, registry=registry, fail_threshold=1)
    eng.set_fleet(endpoints("a", "b", "c"))
    assert eng.registry is registry

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("egress_health_proxies", state="unknown") == 3.0

    async def body() -> None:
        await eng.probe_now("a")
        await eng.probe_now("a")
        await eng.probe_now("b")

    run(body())
    assert sample("egress_health_probes_total", outcome="ok") == 2.0
    assert sample("egress_health_probes_total", outcome="timeout") == 1.0
    assert sample("egress_health_probes_total", outcome="refused") == 0.0
    assert sample("egress_health_proxies", state="healthy") == 1.0
    assert sample("egress_health_proxies", state="unhealthy") == 1.0
    assert sample("egress_health_proxies", state="unknown") == 1.0
    assert sample("egress_health_probe_latency_seconds_count", phase="total") == 2.0
    assert sample("egress_health_probe_latency_seconds_count", phase="connect") == 2.0
    assert sample("egress_health_probe_latency_seconds_sum", phase="total") == pytest.approx(0.002)
    eng.set_fleet(endpoints("a"))
    assert sample("egress_health_proxies", state="healthy") == 1.0
    assert sample("egress_health_proxies", state="unhealthy") == 0.0
    assert sample("egress_health_proxies", state="unknown") == 0.0


def test_two_engines_have_separate_default_registries() -> None:
    first, second = engine(FakeProbe()), engine(FakeProbe())
    assert first.registry is not second.registry


# --- the probe's pure parts -------------------------------------------------------


def test_connect_request_with_and_without_credentials() -> None:
    assert connect_request("example.com:443", None, None) == (
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
    )
    request = connect_request("[2001:db8::1]:443", "crawler", "pa ss:wörd")
    token = base64.b64encode("crawler:pa ss:wörd".encode()).decode()
    assert request == (
        b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n"
        + f"Proxy-Authorization: Basic {token}\r\n\r\n".encode()
    )


@pytest.mark.parametrize(
    ("target", "expected"),
    [("example.com:443", ("example.com", 443)), ("[::1]:8443", ("::1", 8443))],
)
def test_check_target(target: str, expected: tuple[str, int]) -> None:
    assert check_target(target) == expected


@pytest.mark.parametrize("target", ["example.com", "a b:443", "x:70000", "x:443\r\n", ":443"])
def test_check_target_rejects(target: str) -> None:
    with pytest.raises(ValueError):
        check_target(target)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"HTTP/1.1 200 Connection established\r\n", 200),
        (b"HTTP/1.0 200\r\n", 200),
        (b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: x\r\n", 407),
    ],
)
def test_parse_status(head: bytes, status: int) -> None:
    assert parse_status(head)[0] == status


@pytest.mark.parametrize(
    "head",
    [b"SSH-2.0-OpenSSH_9.2\r\n", b"HTTP/2 200\r\n", b"HTTP/1.1 20\r\n", b"HTTP/1.1 200x\r\n"],
)
def test_parse_status_rejects(head: bytes) -> None:
    with pytest.raises(MalformedAnswer):
        parse_status(head)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.OK),
        (204, Outcome.OK),
        (407, Outcome.AUTH_REQUIRED),
        (403, Outcome.DENIED),
        (502, Outcome.UPSTREAM),
        (503, Outcome.UPSTREAM),
        (504, Outcome.UPSTREAM),
        (404, Outcome.ERROR),
        (500, Outcome.ERROR),
    ],
)
def test_classify(status: int, outcome: Outcome) -> None:
    assert classify(status) is outcome
