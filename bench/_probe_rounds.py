"""The health engine's phases as bench/health_probes.py measures them: a first
round (the whole fleet due at once) and one steady-state interval, each timed
by this process's own CPU (user + system).

The steady state keeps every probe's start time from the engine's start, so
a proxy's gap is measured across the window's edges: the largest gap is the
largest time between two probes of one proxy ending in the window, or from a
proxy's last probe to the window's end."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from health.engine import HealthEngine
from health.model import Health, Outcome, ProxyEndpoint
from health.probe import ProbeFn, ProbeResult, probe

TARGET = "127.0.0.1:443"  # the responder answers 200 to anything


@dataclass
class Run:
    label: str
    probes: int
    wall_s: float
    cpu_s: float
    failed: int = 0  # probes that did not pass

    @property
    def rate(self) -> float:
        return self.probes / self.wall_s

    @property
    def cpu_per_1000(self) -> float:
        return self.cpu_s / self.probes * 1000


@dataclass
class Steady:
    """One interval of normal operation of an engine on `proxies` proxies."""

    proxies: int
    run: Run
    interval: float
    largest_gap_s: float
    unprobed: int
    lag_s: float
    outcomes: Counter[Outcome]

    @property
    def core_busy(self) -> float:
        return self.run.cpu_s / self.run.wall_s

    def core_needed(self, proxies: int | None = None) -> float:
        """Share of one core that probing `proxies` (default: this fleet)
        every interval costs, at the CPU per probe measured here."""
        count = self.proxies if proxies is None else proxies
        return count * self.run.cpu_s / self.run.probes / self.interval


async def measured(label: str, probes: int, work: Coroutine[Any, Any, object]) -> Run:
    cpu, wall = time.process_time(), time.perf_counter()
    await work
    return Run(label, probes, time.perf_counter() - wall, time.process_time() - cpu)


class Recording:
    """The real probe, keeping each proxy's probe start times."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.outcomes: Counter[Outcome] = Counter()

    async def __call__(
        self,
        endpoint: ProxyEndpoint,
        target: str,
        *,
        timeout: float,
        tls: bool,
        ca_file: str | None,
    ) -> ProbeResult:
        self.times.setdefault(endpoint.name, []).append(time.perf_counter())
        result = await probe(endpoint, target, timeout=timeout, tls=tls, ca_file=ca_file)
        self.outcomes[result.outcome] += 1
        return result


class Changes:
    """Listener counting health changes: with ok_threshold 1 every proxy's
    first passing probe is one change, so the first round is done at N."""

    def __init__(self) -> None:
        self.count = 0
        self.unhealthy = 0

    def on_health_change(self, name: str, health: Health) -> None:
        self.count += 1
        self.unhealthy += health is Health.UNHEALTHY


async def wait_for(condition: Callable[[], bool], limit: float) -> None:
    async with asyncio.timeout(limit):
        while not condition():
            await asyncio.sleep(0.01)


def new_engine(
    args: argparse.Namespace, listener: Changes, probe_fn: ProbeFn = probe
) -> HealthEngine:
    return HealthEngine(
        target=TARGET,
        interval=args.interval,
        workers=args.workers,
        timeout=args.timeout,
        listener=listener,
        probe_fn=probe_fn,
    )


async def first_round(fleet: list[ProxyEndpoint], args: argparse.Namespace, label: str) -> Run:
    """A fresh engine with the real probe: every proxy new, all due at once;
    done when every proxy has had a result (a failed one counts in `failed`:
    the machine's own trouble, e.g. a SYN dropped under other load)."""
    recording = Recording()
    engine = new_engine(args, Changes(), recording)
    engine.set_fleet(fleet)
    await engine.start()
    try:
        run = await measured(label, len(fleet), wait_for(lambda: done(recording, fleet), 300))
    finally:
        await engine.stop()
    run.failed = sum(n for outcome, n in recording.outcomes.items() if outcome is not Outcome.OK)
    return run


def done(recording: Recording, fleet: list[ProxyEndpoint]) -> bool:
    return sum(recording.outcomes.values()) >= len(fleet)


async def steady_state(
    fleet: list[ProxyEndpoint],
    args: argparse.Namespace,
    label: str,
    settled: Callable[[], object] = lambda: None,
) -> Steady:
    """After a first round (not measured), one interval of normal operation;
    `settled` is called between the two (the shared phase lines replicas up)."""
    recording = Recording()
    engine = new_engine(args, Changes(), recording)
    engine.set_fleet(fleet)
    await engine.start()
    try:
        await wait_for(lambda: done(recording, fleet), 300)
        await asyncio.get_running_loop().run_in_executor(None, settled)
        recording.outcomes.clear()
        cpu, start = time.process_time(), time.perf_counter()
        await asyncio.sleep(args.interval)
        end, cpu = time.perf_counter(), time.process_time() - cpu
        lag = engine.registry.get_sample_value("egress_health_schedule_lag_seconds") or 0.0
    finally:
        await engine.stop()
    probes = gap = 0.0
    unprobed = 0
    for series in recording.times.values():
        inside = [t for t in series if start <= t <= end]
        probes += len(inside)
        unprobed += not inside
        before = [t for t in series if t < start][-1:]
        edges = before + inside + [end]
        gap = max(gap, max(b - a for a, b in itertools.pairwise(edges)))
    unprobed += len(fleet) - len(recording.times)
    failed = sum(n for outcome, n in recording.outcomes.items() if outcome is not Outcome.OK)
    return Steady(
        len(fleet),
        Run(label, int(probes), end - start, cpu, failed),
        args.interval,
        gap,
        unprobed,
        lag,
        recording.outcomes,
    )


CONNTRACK = "/proc/sys/net/netfilter/nf_conntrack_"
waited_s = 0.0  # for room in the connection-tracking table, over the whole run


def conntrack_room(connections: int, limit_s: float = 180.0) -> None:
    """Where the kernel tracks connections (netfilter's conntrack, loaded e.g.
    by a local Kubernetes), every probe's connection keeps an entry for 120 s
    after it closes, and a full table drops new connections' packets: probes
    then time out for the machine's sake, not the engine's (a quiet run at
    5,000 probes/s filled 262,144 entries). Waits, before a phase, until
    `connections` more fit in nine tenths of the table (at most `limit_s`)."""
    global waited_s
    try:
        with open(CONNTRACK + "max") as file:
            most = int(file.read())
    except OSError:
        return  # no connection tracking: nothing to wait for
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        with open(CONNTRACK + "count") as file:
            if int(file.read()) + connections <= most * 0.9:
                break
        time.sleep(1)  # between phases: no engine runs meanwhile
    waited_s += time.monotonic() - start


def use_loop(name: str) -> None:
    """The event loop asyncio.run makes from now on: "uvloop" is what a
    discovery replica runs (uvicorn's loop="auto" takes it when installed)."""
    if name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
