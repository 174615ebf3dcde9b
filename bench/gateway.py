"""Benchmark: the discovery gateway's tunnels against the same squid alone, side
by side in one run (the gateway's contract, docs/gateway.md).

Run: scripts/bench gateway      (or .venv/bin/python -m bench.gateway --help)

Upstream is the project's squid on loopback (tests/support/squid.py, basic
auth as the crawl tests run it, one process); the discovery service
(`python -m discovery serve --gateway ...`, its own process) has that one
squid as its fleet. The target is a small asyncio server in a process of its
own: on one port it sends one byte as soon as a tunnel reaches it and then
closes ("first byte"), on another it sends one byte and keeps the connection
open until the client ends it ("hold"), and on one port per object size it
sends that many bytes and closes ("bulk").

The load generator is this process: asyncio protocols on uvloop, one
connection per tunnel, a CONNECT with Proxy-Authorization, the answer's head,
then the target's bytes. Both sides run the same generator against the same
squid and target; they differ only in where the CONNECT goes: to the squid
(with the fleet's credentials) or to the gateway (holder `bench`, no session,
the service's token), which leases the squid and tunnels through it. Each
phase alternates the two sides (--rounds times each, one warm-up second
before each measurement), so that a machine busy with other work weighs on
both. Measured, in this order:

1. memory: --hold idle tunnels held open at once through each side; the
   resident memory each one costs the service process (and squid, for
   comparison). First, while both processes are fresh.
2. new tunnels per second: --clients clients in a closed loop (open, first
   byte, the target closes, the client closes).
3. tunnel setup latency: the same clients paced (open loop) at --pace of the
   lower side's rate from 2., from the TCP connect to the proxy until the
   target's first byte arrived through the tunnel.
4. bulk: --bulk-clients clients in a closed loop fetching objects of each
   --sizes size through a new tunnel each; bytes received per second.

Each phase also prints the CPU time per tunnel (or per MB) of every process
involved, the load generator's included, so that a reader sees which one ran
out first. The last lines print the contract's figures, their ratios and
whether each meets its target.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from bench._gateway_load import (
    BULK_RATIO,
    HOLDER,
    P50_OVERHEAD_MS,
    P99_OVERHEAD_MS,
    RATE_RATIO,
    ROOT,
    TUNNEL_KIB,
    Result,
    Side,
    TunnelError,
    _Client,
    _Meter,
    _no_gc,
    _open,
    _settle,
    _use_uvloop,
    _window,
    serve_targets,
)
from bench._proc import rss_bytes


async def rate_phase(
    side: Side,
    target_port: int,
    clients: int,
    warmup: float,
    seconds: float,
    pids: dict[str, int],
    pace: float | None = None,
) -> Result:
    """`clients` clients each opening one tunnel after another (first byte, the
    target's close, the client's); with `pace` (tunnels/s in all), each client
    paced at pace/clients, open loop."""
    result = Result(side.name, seconds)
    meter = _Meter()
    measure_from, end = await _window(result, pids, warmup, seconds)
    start = time.perf_counter()

    async def client(index: int) -> None:
        period = clients / pace if pace else 0.0
        due = start + period * index / clients
        while True:
            if period:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                due += period
            t0 = time.perf_counter()
            if t0 >= end:
                return
            if period and t0 - (due - period) > 0.001 and t0 >= measure_from:
                result.late += 1
            try:
                tunnel = await _open(side, target_port, meter)
                t1 = await tunnel.first
                await tunnel.done
            except (OSError, TunnelError) as exc:
                result.errors[
                    type(exc).__name__ + (f" {exc}" if isinstance(exc, TunnelError) else "")
                ] += 1
                await asyncio.sleep(0.01)
                continue
            t2 = time.perf_counter()
            if t0 >= measure_from and t2 <= end:
                result.count += 1
                result.latency_ms.append((t1 - t0) * 1000)

    with _no_gc():
        await asyncio.gather(*(client(i) for i in range(clients)))
        await _settle()
    return result


async def bulk_phase(
    side: Side,
    target_port: int,
    clients: int,
    warmup: float,
    seconds: float,
    pids: dict[str, int],
) -> Result:
    """`clients` clients each fetching one object after another through a new
    tunnel; the bytes that arrive in the window count, whole objects or not."""
    result = Result(side.name, seconds)
    meter = _Meter()
    _, end = await _window(result, pids, warmup, seconds, meter)
    live: set[_Client] = set()

    async def client() -> None:
        while time.perf_counter() < end:
            try:
                tunnel = await _open(side, target_port, meter)
                live.add(tunnel)
                try:
                    await tunnel.done
                finally:
                    live.discard(tunnel)
            except (OSError, TunnelError) as exc:
                if time.perf_counter() < end:
                    result.errors[type(exc).__name__] += 1
                    await asyncio.sleep(0.01)
                continue
            result.count += 1

    async def stop() -> None:
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        for tunnel in list(live):  # objects still under way end with the window
            tunnel.abort()

    with _no_gc():
        await asyncio.gather(stop(), *(client() for _ in range(clients)))
        await _settle()
    return result


@dataclass
class Held:
    side: str
    tunnels: int
    rss_delta: dict[str, int]  # bytes, per process
    errors: Counter[str]


async def hold_phase(
    side: Side, target_port: int, count: int, concurrency: int, pids: dict[str, int]
) -> Held:
    """Opens `count` tunnels (each to its first byte), `concurrency` at a time,
    keeps them open and idle, and measures what the processes' resident memory
    grew by; then closes them."""
    meter = _Meter()
    errors: Counter[str] = Counter()
    held: list[_Client] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            try:
                tunnel = await _open(side, target_port, meter)
                await tunnel.first
            except (OSError, TunnelError) as exc:
                errors[type(exc).__name__] += 1
                return
            held.append(tunnel)

    # A warm-up: the first tunnels' allocations are no tunnel's own.
    await asyncio.gather(*(one() for _ in range(min(count, concurrency))))
    for tunnel in held:
        tunnel.abort()
    held.clear()
    await asyncio.sleep(0.5)
    before = {name: rss_bytes(pid) for name, pid in pids.items()}
    await asyncio.gather(*(one() for _ in range(count)))
    await asyncio.sleep(1.0)
    after = {name: rss_bytes(pid) for name, pid in pids.items()}
    opened = len(held)
    for tunnel in held:
        assert tunnel.transport is not None
        tunnel.transport.close()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            await asyncio.gather(*(t.done for t in held), return_exceptions=True)
    await asyncio.sleep(0.5)
    return Held(side.name, opened, {n: after[n] - before[n] for n in pids}, errors)


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Sides:
    squid: Side
    gateway: Side
    pids: dict[str, int]  # every process involved: the generator, target, squid, service


async def _alternate(
    rounds: int, sides: Sides, measure: Callable[[Side], Awaitable[Result]]
) -> tuple[Result, Result]:
    """Each side `rounds` times, alternating; the results merged per side."""
    merged: dict[str, Result] = {}
    for _ in range(rounds):
        for side in (sides.squid, sides.gateway):
            result = await measure(side)
            if side.name in merged:
                merged[side.name].merge(result)
            else:
                merged[side.name] = result
    return merged[sides.squid.name], merged[sides.gateway.name]


def _errors(result: Result) -> str:
    if not result.errors:
        return ""
    return "  errors: " + ", ".join(f"{k} x{v}" for k, v in result.errors.most_common())


def _verdict(ok: bool) -> str:
    return "meets the target" if ok else "MISSES the target"


async def run(args: argparse.Namespace, sides: Sides, ports: dict[str, object]) -> list[str]:
    """The phases in order; returns the summary lines."""
    pids = sides.pids
    first, hold = cast(int, ports["first"]), cast(int, ports["hold"])
    bulk = cast(dict[str, int], ports["bulk"])
    summary: list[str] = []

    # 1. Memory per open tunnel, while the processes are fresh.
    held: dict[str, Held] = {}
    for side in (sides.squid, sides.gateway):
        held[side.name] = await hold_phase(side, hold, args.hold, 200, pids)
    print(f"-- memory: {args.hold} idle tunnels held open at once (RSS growth / tunnels)")
    for name, item in held.items():
        growth = ", ".join(
            f"{proc} {delta / max(1, item.tunnels) / 1024:.1f} KiB"
            for proc, delta in item.rss_delta.items()
            if proc in ("squid", "service")
        )
        errors = f"  errors: {dict(item.errors)}" if item.errors else ""
        print(f"{name:<16} {item.tunnels} open: {growth}{errors}")
    gw_held = held[sides.gateway.name]
    per_tunnel = gw_held.rss_delta["service"] / max(1, gw_held.tunnels) / 1024
    squid_per = held[sides.squid.name].rss_delta["squid"] / max(1, held[sides.squid.name].tunnels)
    ratio = per_tunnel * 1024 / squid_per if squid_per > 0 else float("nan")
    summary.append(
        f"memory per open tunnel (service RSS): {per_tunnel:.1f} KiB, {ratio:.2f}x squid's own "
        f"{squid_per / 1024:.1f} KiB (target <= {TUNNEL_KIB:.0f} KiB): "
        + _verdict(per_tunnel <= TUNNEL_KIB)
    )

    # 2. New tunnels per second, closed loop.
    rates = await _alternate(
        args.rounds,
        sides,
        lambda side: rate_phase(side, first, args.clients, args.warmup, args.seconds, pids),
    )
    print(f"-- new tunnels per second: {args.clients} clients, closed loop")
    for result in rates:
        print(
            f"{result.side:<16} {result.rate:8.0f} tunnels/s  setup p50 {result.pct(0.5):6.2f} ms "
            f"p99 {result.pct(0.99):6.2f} ms  ({result.cpu_line(result.count, 'per tunnel')})"
            + _errors(result)
        )
    squid_rate, gw_rate = rates
    # Where the limit lies: with every CPU busy, the sum of CPU per tunnel; with
    # a CPU for each process, the busiest single-threaded process.
    total = [sum(r.cpu.values()) / max(1, r.count) * 1e6 for r in rates]
    alone = {
        "squid": squid_rate.count / max(squid_rate.cpu.get("squid", 0.0), 1e-9),
        "service": gw_rate.count / max(gw_rate.cpu.get("service", 0.0), 1e-9),
    }
    print(
        f"CPU per tunnel, every process: squid alone {total[0]:.0f} us, gateway+squid "
        f"{total[1]:.0f} us ({total[0] / max(total[1], 1e-9):.2f}x: the rate ratio when the "
        f"{os.cpu_count()} CPUs are the limit); each on a CPU of its own would make at most "
        + ", ".join(f"{n} {r:.0f}/s" for n, r in alone.items())
    )
    ratio = gw_rate.rate / squid_rate.rate if squid_rate.rate else float("nan")
    summary.append(
        f"new tunnels/s: gateway+squid {gw_rate.rate:.0f}, squid alone {squid_rate.rate:.0f}: "
        f"{ratio:.2f}x (target >= {RATE_RATIO}x): " + _verdict(ratio >= RATE_RATIO)
    )

    # 3. Setup latency, paced below both sides' capacity.
    pace = args.rate or args.pace * min(squid_rate.rate, gw_rate.rate)
    latencies = await _alternate(
        args.rounds,
        sides,
        lambda side: rate_phase(
            side, first, args.clients, args.warmup, args.seconds, pids, pace=pace
        ),
    )
    print(
        f"-- tunnel setup (TCP connect to the target's first byte): {args.clients} clients "
        f"paced at {pace:.0f} tunnels/s in all"
    )
    for result in latencies:
        print(
            f"{result.side:<16} p50 {result.pct(0.5):6.2f} ms  p90 {result.pct(0.9):6.2f} ms  "
            f"p99 {result.pct(0.99):6.2f} ms  max {result.pct(1.0):6.2f} ms  "
            f"({result.count} tunnels, {result.late} started late; "
            f"{result.cpu_line(result.count, 'per tunnel')})" + _errors(result)
        )
    squid_lat, gw_lat = latencies
    for q, target in ((0.5, P50_OVERHEAD_MS), (0.99, P99_OVERHEAD_MS)):
        overhead = gw_lat.pct(q) - squid_lat.pct(q)
        summary.append(
            f"setup p{q * 100:.0f} overhead: {overhead:+.2f} ms "
            f"({gw_lat.pct(q):.2f} vs {squid_lat.pct(q):.2f} ms, "
            f"{gw_lat.pct(q) / squid_lat.pct(q):.2f}x) (target <= {target:g} ms): "
            + _verdict(overhead <= target)
        )

    # 4. Bulk bytes.
    for size in args.sizes:
        port = bulk[str(size)]
        results = await _alternate(
            args.rounds,
            sides,
            functools.partial(
                bulk_phase,
                target_port=port,
                clients=args.bulk_clients,
                warmup=args.warmup,
                seconds=args.seconds,
                pids=pids,
            ),
        )
        print(f"-- bulk: {_size(size)} objects, {args.bulk_clients} clients, closed loop")
        for result in results:
            print(
                f"{result.side:<16} {result.mb_per_s:8.0f} MB/s  {result.count} objects  "
                f"({result.cpu_line(result.bytes / 1e6, 'per MB')})" + _errors(result)
            )
        squid_bulk, gw_bulk = results
        ratio = gw_bulk.mb_per_s / squid_bulk.mb_per_s if squid_bulk.mb_per_s else float("nan")
        summary.append(
            f"bulk {_size(size)}: gateway+squid {gw_bulk.mb_per_s:.0f} MB/s, squid alone "
            f"{squid_bulk.mb_per_s:.0f} MB/s: {ratio:.2f}x (target >= {BULK_RATIO}x): "
            + _verdict(ratio >= BULK_RATIO)
        )
    return summary


def _size(size: int) -> str:
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size >= 1024 and size % 1024 == 0:
        return f"{size >> 10} KiB"
    return f"{size} B"


def _start_targets(sizes: list[int]) -> tuple[subprocess.Popen[str], dict[str, object]]:
    command = [sys.executable, "-m", "bench.gateway", "--serve-targets"]
    command += ["--sizes", ",".join(str(s) for s in sizes)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"the target server exited with {process.wait()}")
    return process, cast(dict[str, object], json.loads(line))


def _start_service(
    tmp: Path, squid_port: int, squid_password: str, args: argparse.Namespace, gateway_port: int
) -> subprocess.Popen[bytes]:
    """`python -m discovery serve --gateway` over the one squid, ready and the squid healthy."""
    import httpx

    from tests.support.crawlsite import TOKEN
    from tests.support.discovery import all_healthy, api_client, free_port, proxy_entry, write_fleet

    fleet = tmp / "fleet.json"
    write_fleet(
        fleet,
        [proxy_entry("sq0", port=squid_port, username="crawler", password=squid_password)],
    )
    listen = f"127.0.0.1:{free_port()}"
    tunnels = args.hold + 2 * args.bulk_clients + 2 * args.clients
    command = [sys.executable]
    if args.profile is not None:
        command += ["-m", "cProfile", "-o", str(args.profile.resolve())]
    command += ["-m", "discovery", "serve", "--fleet", str(fleet), "--db", str(tmp / "leases.db")]
    command += ["--listen", listen, "--gateway", f"127.0.0.1:{gateway_port}"]
    command += ["--probe-target", f"127.0.0.1:{args.probe_port}", "--probe-interval", "10"]
    command += ["--gateway-max-tunnels", str(tunnels), "--gateway-holder-tunnels", str(tunnels)]
    command += ["--gateway-site-leases", str(args.site_leases)]
    with (tmp / "service.log").open("ab") as log:
        service = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "DISCOVERY_TOKEN": TOKEN},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    deadline = time.monotonic() + 30
    with api_client(f"http://{listen}", TOKEN) as http:
        while True:
            if service.poll() is not None:
                raise SystemExit(
                    f"the service exited with {service.returncode}:\n"
                    + (tmp / "service.log").read_text()[-3000:]
                )
            try:
                if all_healthy(http, {"sq0"}):
                    return service
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                service.kill()
                raise SystemExit("the service did not call its squid healthy in 30 s")
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="for setup latency and rate")
    parser.add_argument("--bulk-clients", type=int, default=200)
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(s) for s in text.split(",")],
        default=[100 * 1024, 10 * 1024 * 1024],
        help="bulk object sizes in bytes, comma-separated (default 100 KiB and 10 MiB)",
    )
    parser.add_argument("--hold", type=int, default=2000, help="idle tunnels held open at once")
    parser.add_argument("--seconds", type=float, default=4.0, help="per side, round and phase")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.5,
        help="the latency phase's rate as a share of the lower measured tunnel rate",
    )
    parser.add_argument("--rate", type=float, help="the latency phase's rate in tunnels/s")
    parser.add_argument(
        "--site-leases", type=int, default=4, help="the gateway's --gateway-site-leases"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run the service under cProfile (slower) and print where its time goes",
    )
    parser.add_argument("--serve-targets", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_targets:
        serve_targets(args.sizes)
        return

    from tests.support.crawlsite import PASSWORD, TOKEN
    from tests.support.discovery import free_port
    from tests.support.squid import EchoServer, loopback_settings, start_squid

    load_start = os.getloadavg()
    print(
        f"gateway: {os.cpu_count()} CPUs, load average at start "
        + " ".join(f"{x:.2f}" for x in load_start)
        + f"; {args.rounds} rounds per side of {args.warmup:g} s warm-up + {args.seconds:g} s; "
        "nothing pinned"
    )
    fds = 4 * (args.hold + args.bulk_clients + args.clients) + 1024
    probe = EchoServer()
    args.probe_port = probe.port
    targets, ports = _start_targets(args.sizes)
    squid = start_squid(
        loopback_settings(auth_username="crawler"),
        password=PASSWORD,
        extra_config=[f"max_filedescriptors {fds}"],
    )
    service: subprocess.Popen[bytes] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp_name:
            gateway_port = free_port()
            service = _start_service(Path(tmp_name), squid.port, PASSWORD, args, gateway_port)
            assert squid.pid is not None
            pids = {
                "generator": os.getpid(),
                "target": targets.pid,
                "squid": squid.pid,
                "service": service.pid,
            }

            def basic(user: str, password: str) -> str:
                return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

            sides = Sides(
                Side("squid alone", squid.port, basic("crawler", PASSWORD), squid.pid),
                Side("gateway+squid", gateway_port, basic(HOLDER, TOKEN), service.pid),
                pids,
            )
            _use_uvloop()
            summary = asyncio.run(run(args, sides, ports))
            service.terminate()
            service.wait(timeout=30)
            if args.profile is not None:
                import pstats

                pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(30)
    finally:
        if service is not None and service.poll() is None:
            service.kill()
            service.wait()
        squid.close()
        targets.kill()
        targets.wait()
        probe.close()
    print("-- the contract, gateway+squid against squid alone in this run")
    for line in summary:
        print(line)
    print("load average at end " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
