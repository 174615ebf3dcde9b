"""Benchmark: the health engine probing a 10,000-proxy fleet on one core.

Run: .venv/bin/python -m bench.health_probes   (or scripts/bench health_probes)

A CONNECT responder (tests/support/responders.py) runs in its own process on
many loopback ports, pinned to another core when there is one; the fleet is
--proxies entries spread over those ports.  This process is pinned to one core
and measured with its own CPU time (user + system).  In the same run:

1. baselines: a plain asyncio loop over the same endpoints with the same
   concurrency, `open_connection` then close, and `open_connection`, write
   CONNECT, read the answer head, close;
2. the engine's first round: the whole fleet is new, so every proxy is due at
   once and the engine runs flat out with --workers probes in flight; its
   rate gives the interval the fleet needs;
3. the engine in steady state for one --interval: probes spread over the
   interval, each proxy's largest gap between probes, and the share of the
   core it used.

1 and 2 run --rounds times, interleaved, and are reported as median (min-max):
the wall-clock rates move with whatever else the machine runs, CPU per probe
much less.  The whole run takes about a minute and a half.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from health.engine import HealthEngine
from health.model import Health, Outcome, ProxyEndpoint
from health.probe import ProbeFn, ProbeResult, connect_request, probe

TARGET = "127.0.0.1:443"  # the responder answers 200 to anything


@dataclass
class Run:
    label: str
    probes: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.probes / self.wall_s

    @property
    def cpu_per_1000(self) -> float:
        return self.cpu_s / self.probes * 1000


def raise_open_file_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def pin_cores() -> tuple[int, int | None]:
    """This process to one core, the other core (if any) for the responder."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[0]})
    return cores[0], (cores[1] if len(cores) > 1 else None)


def start_responder(ports: int, core: int | None) -> tuple[subprocess.Popen[bytes], list[int]]:
    responder = subprocess.Popen(
        [sys.executable, "-m", "tests.support.responders", "--ports", str(ports)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    if core is not None:
        os.sched_setaffinity(responder.pid, {core})
    assert responder.stdout is not None
    line = responder.stdout.readline()
    if not line:
        responder.kill()
        raise RuntimeError("the responder did not start")
    return responder, list(json.loads(line))


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(label: str, probes: int, work: Coroutine[Any, Any, object]) -> Run:
    cpu, wall = time.process_time(), time.perf_counter()
    await work
    return Run(label, probes, time.perf_counter() - wall, time.process_time() - cpu)


async def plain_loop(fleet: list[ProxyEndpoint], workers: int, exchange: bool) -> None:
    """What a probe costs at the least: asyncio streams, no timing or state."""
    request = connect_request(TARGET, None, None)
    slots = asyncio.Semaphore(workers)

    async def one(endpoint: ProxyEndpoint) -> None:
        async with slots:
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            if exchange:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(one(endpoint) for endpoint in fleet))


class Recording:
    """The real probe, keeping each proxy's probe start times (steady state)."""

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


async def first_round(fleet: list[ProxyEndpoint], args: argparse.Namespace) -> Run:
    """A fresh engine with the real probe: every proxy new, all due at once."""
    changes = Changes()
    engine = new_engine(args, changes)
    engine.set_fleet(fleet)
    await engine.start()
    try:
        run = await measured(
            "engine: first round, all due at once",
            len(fleet),
            wait_for(lambda: changes.count >= len(fleet), limit=120),
        )
    finally:
        await engine.stop()
    if changes.unhealthy:
        raise RuntimeError(f"{changes.unhealthy} proxies failed their probe")
    return run


@dataclass
class Steady:
    run: Run
    largest_gap_s: float
    unprobed: int
    lag_s: float
    outcomes: Counter[Outcome]


async def steady_state(fleet: list[ProxyEndpoint], args: argparse.Namespace) -> Steady:
    """After a first round (not measured), one interval of normal operation."""
    changes, recording = Changes(), Recording()
    engine = new_engine(args, changes, recording)
    engine.set_fleet(fleet)
    await engine.start()
    try:
        await wait_for(lambda: changes.count >= len(fleet), limit=120)
        recording.times.clear()
        recording.outcomes.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(args.interval)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        probes = sum(map(len, recording.times.values()))
        lag = engine.registry.get_sample_value("egress_health_schedule_lag_seconds") or 0.0
    finally:
        await engine.stop()
    gaps = [b - a for series in recording.times.values() for a, b in itertools.pairwise(series)]
    return Steady(
        Run(f"engine: steady state, {args.interval:g} s", probes, wall, cpu),
        max(gaps, default=float("nan")),
        len(fleet) - len(recording.times),
        lag,
        recording.outcomes,
    )


def _spread(values: list[float], fmt: str) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"


def report(args: argparse.Namespace, rounds: dict[str, list[Run]], steady: Steady) -> None:
    print(
        f"fleet {args.proxies} proxies over {args.ports} loopback ports, {args.workers} workers, "
        f"{args.rounds} rounds; median (min-max)"
    )
    print(f"{'':40} {'probes/s':>22} {'CPU s per 1000':>24}")
    for label, runs in rounds.items():
        rates = _spread([r.rate for r in runs], ".0f")
        costs = _spread([r.cpu_per_1000 for r in runs], ".3f")
        print(f"{label:40} {rates:>22} {costs:>24}")
    s = steady.run
    print(f"{s.label:40} {s.rate:>22.0f} {s.cpu_per_1000:>24.3f}")
    baseline = rounds[PLAIN_CONNECT]
    engine = rounds[ENGINE]
    rate = statistics.median(r.rate for r in engine)
    cpu = statistics.median(r.cpu_per_1000 for r in engine)
    print(
        f"engine against the plain CONNECT loop: "
        f"{rate / statistics.median(r.rate for r in baseline):.2f}x the rate, "
        f"{cpu / statistics.median(r.cpu_per_1000 for r in baseline):.2f}x the CPU per probe"
    )
    print(
        f"interval the fleet needs: {args.proxies / rate:.1f} s at the measured rate, "
        f"{args.proxies * cpu / 1000:.1f} s of one core's CPU (goal: within {args.interval:g} s)"
    )
    print(
        f"steady state: {s.probes} probes in {s.wall_s:.1f} s, core busy {s.cpu_s / s.wall_s:.0%}, "
        f"largest gap between two probes of one proxy {steady.largest_gap_s:.2f} s, "
        f"proxies without a probe in the window {steady.unprobed}, "
        f"schedule lag at the end {steady.lag_s:.3f} s"
    )
    print(f"outcomes: {', '.join(f'{o.value} {n}' for o, n in sorted(steady.outcomes.items()))}")


CONNECT_ONLY = "plain asyncio: open_connection + close"
PLAIN_CONNECT = "plain asyncio: open_connection + CONNECT"
ENGINE = "engine: first round, all due at once"


async def bench(args: argparse.Namespace, ports: list[int]) -> tuple[dict[str, list[Run]], Steady]:
    fleet = [
        ProxyEndpoint(f"p{i}", "127.0.0.1", ports[i % len(ports)]) for i in range(args.proxies)
    ]
    rounds: dict[str, list[Run]] = {CONNECT_ONLY: [], PLAIN_CONNECT: [], ENGINE: []}
    # Interleaved, so a burst of other work on the machine hits all kinds alike.
    for _ in range(args.rounds):
        rounds[CONNECT_ONLY].append(
            await measured(CONNECT_ONLY, len(fleet), plain_loop(fleet, args.workers, False))
        )
        rounds[PLAIN_CONNECT].append(
            await measured(PLAIN_CONNECT, len(fleet), plain_loop(fleet, args.workers, True))
        )
        rounds[ENGINE].append(await first_round(fleet, args))
    return rounds, await steady_state(fleet, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxies", type=int, default=10_000)
    parser.add_argument("--ports", type=int, default=1000, help="responder ports")
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    limit = raise_open_file_limit(args.workers + args.ports + 1024)
    own, other = pin_cores()
    print(
        f"this process on core {own}, responder on core {other}, open-file limit {limit}, "
        f"load average (1 min) {os.getloadavg()[0]:.2f}"
    )
    responder, ports = start_responder(args.ports, other)
    try:
        rounds, steady = asyncio.run(bench(args, ports))
        responder_cpu = process_cpu_s(responder.pid)
    finally:
        assert responder.stdin is not None
        responder.stdin.close()
        responder.wait(timeout=30)
    report(args, rounds, steady)
    print(f"responder CPU over the whole run (other core): {responder_cpu:.1f} s")
    # Other work on the machine slows the wall-clock figures more than CPU per probe.
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
