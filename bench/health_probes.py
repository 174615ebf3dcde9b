"""Benchmark: the health engine probing 10,000 and 50,000 proxies per
interval, on one core and shared by two replicas.

Run: .venv/bin/python -m bench.health_probes   (or scripts/bench health_probes)

A CONNECT responder (bench/_responder.py, on uvloop) runs in its own process on
many loopback ports, pinned to another core when there is one; each fleet is
--sizes entries spread over those ports. This process is pinned to one core
and measured with its own CPU time (user + system). In the same run:

1. baselines (first size, default loop): a plain asyncio loop over the same
   endpoints with the same concurrency, `open_connection` then close, and
   `open_connection`, write CONNECT, read the answer head, close;
2. per size and per event loop (asyncio's default, and uvloop, which a
   discovery replica runs): the engine's first round (the whole fleet new,
   due at once, --workers probes in flight), and one --interval of steady
   state: CPU per probe, the share of one core that keeps the interval
   (fleet x CPU per probe / interval), the share the core was busy, and the
   largest gap between two probes of one proxy;
3. the largest fleet shared by --replicas replicas (bench/_probe_shares.py:
   the split of discovery/postgres/sharing.py, one process per replica,
   uvloop), one steady interval at the same time: the same figures per
   replica.

Baselines and first rounds run --rounds times, interleaved, and are
reported as median (min-max): the wall-clock rates move with whatever else
the machine runs, CPU per probe much less. Where the kernel tracks
connections (conntrack), each phase first waits for room in its table
(bench/_probe_rounds.py: a full one drops probes' packets). The whole run
takes about four minutes, more with those waits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys

from bench import _probe_rounds
from bench._probe_rounds import (
    TARGET,
    Run,
    Steady,
    conntrack_room,
    first_round,
    measured,
    steady_state,
    use_loop,
)
from bench._probe_shares import shared
from bench._proc import cpu_seconds
from health import engine
from health.model import ProxyEndpoint
from health.probe import connect_request


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
        [sys.executable, "-m", "bench._responder", "--ports", str(ports)],
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


def _spread(values: list[float], fmt: str) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"


CONNECT_ONLY = "plain asyncio: open_connection + close"
PLAIN_CONNECT = "plain asyncio: open_connection + CONNECT"


def make_fleet(size: int, ports: list[int]) -> list[ProxyEndpoint]:
    return [ProxyEndpoint(f"p{i}", "127.0.0.1", ports[i % len(ports)]) for i in range(size)]


async def baselines(fleet: list[ProxyEndpoint], args: argparse.Namespace) -> dict[str, list[Run]]:
    rounds: dict[str, list[Run]] = {CONNECT_ONLY: [], PLAIN_CONNECT: []}
    # Interleaved, so a burst of other work on the machine hits both alike.
    for _ in range(args.rounds):
        for label, exchange in ((CONNECT_ONLY, False), (PLAIN_CONNECT, True)):
            conntrack_room(len(fleet))
            rounds[label].append(
                await measured(label, len(fleet), plain_loop(fleet, args.workers, exchange))
            )
    return rounds


async def one_size(
    fleet: list[ProxyEndpoint], args: argparse.Namespace, loop: str
) -> tuple[list[Run], Steady]:
    label = f"{len(fleet):,} proxies, {loop}"
    first = []
    for _ in range(args.rounds):
        conntrack_room(len(fleet))
        first.append(await first_round(fleet, args, f"{label}: first round"))
    conntrack_room(2 * len(fleet))  # its own first round, then the interval
    return first, await steady_state(fleet, args, f"{label}: steady {args.interval:g} s")


def print_rounds(rounds: dict[str, list[Run]]) -> None:
    for label, runs in rounds.items():
        rates = _spread([r.rate for r in runs], ".0f")
        costs = _spread([r.cpu_per_1000 * 1000 for r in runs], ".0f")
        failed = sum(r.failed for r in runs)
        print(f"{label:44} {rates:>20} {costs:>20}" + (f"  failed {failed}" if failed else ""))


def print_steady(steady: Steady, args: argparse.Namespace) -> None:
    s = steady.run
    print(
        f"{s.label:44} {s.rate:>20.0f} {s.cpu_per_1000 * 1000:>20.0f}  "
        f"keeps {args.interval:g} s with {steady.core_needed():.0%} of a core; "
        f"core busy {steady.core_busy:.0%}; largest gap {steady.largest_gap_s:.2f} s; "
        f"unprobed {steady.unprobed}; lag {steady.lag_s:.2f} s; failed {s.failed}"
    )


def run_bench(args: argparse.Namespace, ports: list[int], responder: int) -> None:
    sizes = [int(n) for n in args.sizes.split(",")]
    print(f"{'':44} {'probes/s':>20} {'CPU us per probe':>20}")
    use_loop("asyncio")
    print_rounds(asyncio.run(baselines(make_fleet(sizes[0], ports), args)))
    needed: dict[str, float] = {}
    for size in sizes:
        fleet = make_fleet(size, ports)
        for loop in args.loops.split(","):
            use_loop(loop)
            first, steady = asyncio.run(one_size(fleet, args, loop))
            print_rounds({first[0].label: first})
            print_steady(steady, args)
            needed[f"{size:,} proxies, {loop}"] = steady.core_needed()
    largest = make_fleet(sizes[-1], ports)
    os.sched_setaffinity(responder, range(os.cpu_count() or 1))  # the replicas take a core each
    conntrack_room(2 * len(largest))
    print(
        f"{sizes[-1]:,} proxies shared by {args.replicas} replicas (uvloop), "
        f"one steady {args.interval:g} s interval at the same time:"
    )
    for slot, steady in shared(largest, args, args.replicas):
        print(f"  {steady.proxies:,} proxies:", end=" ")
        print_steady(steady, args)
        needed[f"replica {slot}, {steady.proxies:,} proxies"] = steady.core_needed()
    print(f"share of one core that keeps every proxy probed each {args.interval:g} s:")
    for label, share in needed.items():
        print(f"  {label}: {share:.0%} ({'within' if share < 1 else 'over'} one core)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,50000", help="fleets, comma-separated")
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--replicas", type=int, default=2, help="sharing the largest fleet")
    parser.add_argument("--ports", type=int, default=1000, help="responder ports")
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--tick", type=float, default=engine.TICK_S, help="the engine's; 0: a wake-up per probe"
    )
    args = parser.parse_args()
    engine.TICK_S = args.tick
    limit = raise_open_file_limit(args.workers + args.ports + 1024)
    own, other = pin_cores()
    print(
        f"this process on core {own}, responder on core {other}, open-file limit {limit}, "
        f"load average (1 min) {os.getloadavg()[0]:.2f}; {args.ports} responder ports, "
        f"{args.workers} workers, {args.rounds} rounds, median (min-max), tick {args.tick:g} s"
    )
    responder, ports = start_responder(args.ports, other)
    try:
        run_bench(args, ports, responder.pid)
        responder_cpu = cpu_seconds(responder.pid)
    finally:
        assert responder.stdin is not None
        responder.stdin.close()
        responder.wait(timeout=30)
    print(f"responder CPU over the whole run: {responder_cpu:.1f} s")
    print(
        f"waited {_probe_rounds.waited_s:.0f} s in all for room in the kernel's "
        "connection-tracking table before phases"
    )
    # Other work on the machine slows the wall-clock figures more than CPU per probe.
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
