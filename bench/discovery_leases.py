"""Benchmark: lease grant+release pairs per second and their latency, against
the same server's /healthz as the ceiling, in one run.

Run: scripts/bench discovery_leases      (or .venv/bin/python -m bench.discovery_leases)

The server is the real app (discovery.app on uvicorn, one worker, the SQLite
store with fsync on every commit) in its own process pinned to one CPU; the
fleet has --proxies proxies that a stand-in health source calls healthy (the
benchmark is about leases, not probes). The load generator runs in this
process, pinned to another CPU: --clients concurrent clients, each on its own
keep-alive connection, each looping POST /v1/leases then DELETE
/v1/leases/{id} (one pair) for --seconds after a warm-up. The /healthz phase
runs the same clients doing two GETs per loop: the framework's ceiling for a
"pair" of requests on this machine. Then an open-loop phase offers a fixed
rate (half the measured grant+release rate unless --rate says otherwise) and
reports its latency; then the lease book alone ("no HTTP"); then, unless
--no-postgres, grant+release against one and against two replicas sharing a
private PostgreSQL (scripts/postgres, a free port, removed afterwards): the
replicas on the server's CPU, PostgreSQL with the clients on theirs, so
that one replica and two have the same CPU and the second one's cost per
pair is its own, not four busy processes' scramble for two cores. Last, the
one replica again with a busy process sharing its core ("pg 1, core
shared"): what sharing a core costs a replica by itself, which two replicas
pay here and not on a machine that gives each a core of its own.
The last lines print the goals' figures as ratios within this run.

The client is a small HTTP/1.1 client on asyncio's protocol layer: httpx
would need more CPU per request than the server and measure itself. Its
garbage collector is off during each phase, so that its own pauses are not
counted as the server's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._lease_load import PhaseResult, first_grant, metric, run_phase, scrape, slow_commits
from bench._lease_server import (
    ROOT,
    book_only,
    busy_beside,
    free_port,
    pin_tree,
    serve,
    start_server,
    stop_servers,
    use_uvloop,
    write_fleet,
)

OPEN_LOOP_SHARE = 0.5  # the open-loop phase offers this share of the measured capacity
SHARED = "pg 1, core shared"


async def _run(args: argparse.Namespace, port: int, server_pid: int) -> list[PhaseResult]:
    results = []
    for name, leases in (("healthz x2", False), ("grant+release", True)):
        results.append(
            await run_phase(
                name, [port], args.clients, args.seconds, args.warmup, [server_pid], leases
            )
        )
    # Open loop: a fixed offered rate, by default half of what was just measured.
    rates = args.rate or [round(results[1].pairs_per_s * OPEN_LOOP_SHARE)]
    for rate in rates:
        before = slow_commits(await scrape(port))
        results.append(
            await run_phase(
                f"paced {rate:.0f}/s",
                [port],
                args.clients,
                args.seconds,
                args.warmup,
                [server_pid],
                True,
                rate,
            )
        )
        # The disk's share of the tail: an fsync that stalls holds every
        # answer queued behind it (warm-up included in these counts).
        after = slow_commits(await scrape(port))
        total, over_5, over_10 = (a - b for a, b in zip(after, before, strict=True))
        print(
            f"{results[-1].name}: {total:.0f} commits, {over_5:.0f} over 5 ms, "
            f"{over_10:.0f} over 10 ms"
        )
    metrics = await scrape(port)
    commits = metric(metrics, "discovery_store_commit_duration_seconds_count")
    commit_sum = metric(metrics, "discovery_store_commit_duration_seconds_sum")
    ops = metric(metrics, "discovery_store_ops_total")
    if commits:
        print(
            f"store: {commits:.0f} commits, {ops / commits:.1f} ops per commit, "
            f"{commit_sum / commits * 1000:.2f} ms per commit (fsync included)"
        )
    return results


def _postgres_phases(
    args: argparse.Namespace, fleet: Path, tmp: Path, pinned: bool
) -> list[PhaseResult]:
    """grant+release with one replica, then two, on one PostgreSQL (a private
    server of scripts/postgres on a free port, removed afterwards). PINNED:
    the replicas share the server's CPU, as the SQLite server had it alone,
    and PostgreSQL shares the clients' CPU, so that one replica and two get
    the same CPU (what one more replica adds is then its own cost, not a
    scramble of four busy processes for two cores); else nothing is pinned."""
    port = free_port()
    script = ROOT / "scripts" / "postgres"
    started = subprocess.run(
        [str(script), "start", "--port", str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    url = started.stdout.strip().splitlines()[-1]
    postmaster = int((ROOT / ".cache" / "postgres" / str(port) / "pid").read_text().split()[0])
    if pinned:
        pin_tree(postmaster, args.client_cpu)
    cpus = os.sched_getaffinity(0)
    results = []
    servers: list[subprocess.Popen[bytes]] = []
    servers_ports: list[int] = []
    try:
        for count in (1, 2):
            while len(servers) < count:
                server, server_port = start_server(
                    fleet,
                    url,
                    tmp / f"replica{len(servers)}.log",
                    args.server_cpu if pinned else None,
                )
                servers.append(server)
                servers_ports.append(server_port)
            ports = servers_ports[:count]
            asyncio.run(first_grant(ports))
            if pinned:
                os.sched_setaffinity(0, {args.client_cpu})
            results.append(
                asyncio.run(
                    run_phase(
                        f"pg {count} replica" + ("s" if count > 1 else ""),
                        ports,
                        args.clients,
                        args.seconds,
                        args.warmup,
                        [s.pid for s in servers[:count]],
                        True,
                        database_pid=postmaster,
                    )
                )
            )
        if pinned:
            # What sharing a core costs alone: the one replica again, its core
            # shared with a busy process instead of a second replica. Two
            # cores put both replicas on one; a larger machine gives each its own.
            with busy_beside(args.server_cpu):
                results.append(
                    asyncio.run(
                        run_phase(
                            SHARED,
                            servers_ports[:1],
                            args.clients,
                            args.seconds,
                            args.warmup,
                            [servers[0].pid],
                            True,
                            database_pid=postmaster,
                        )
                    )
                )
    finally:
        os.sched_setaffinity(0, cpus)
        stop_servers(servers)
        subprocess.run([str(script), "remove", "--port", str(port)], cwd=ROOT, check=False)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--proxies", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--rate",
        type=float,
        action="append",
        metavar="PAIRS_PER_S",
        help="the open-loop phase's offered rate (repeatable; default: half the measured "
        "grant+release rate)",
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="skip the PostgreSQL replica phases"
    )
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run the server under cProfile (slower) and print where its time goes",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--book", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        sys.exit(serve(args.fleet, args.db, args.port, args.server_cpu, args.profile))
    if args.book:
        book_only(
            args.fleet, Path(args.db), args.clients, args.seconds, args.warmup, args.server_cpu
        )
        return

    if args.clients > args.proxies:
        parser.error("--clients must not exceed --proxies (every client holds one lease at a time)")
    cpus = os.sched_getaffinity(0)
    pinned = (
        args.server_cpu in cpus and args.client_cpu in cpus and args.server_cpu != args.client_cpu
    )
    with tempfile.TemporaryDirectory(prefix="discovery-bench-") as tmp_name:
        tmp = Path(tmp_name)
        fleet, db = tmp / "fleet.json", tmp / "leases.db"
        write_fleet(fleet, args.proxies)
        server, port = start_server(
            fleet,
            str(db),
            tmp / "server.log",
            args.server_cpu if pinned else None,
            args.profile,
        )
        try:
            if pinned:
                os.sched_setaffinity(0, {args.client_cpu})
            use_uvloop()
            print(
                f"discovery_leases: {args.clients} clients, {args.proxies} proxies, "
                f"{args.seconds:.0f} s per phase after {args.warmup:.0f} s warm-up; server on "
                + (
                    f"CPU {args.server_cpu}, clients on CPU {args.client_cpu}"
                    if pinned
                    else "unpinned"
                )
            )
            results = asyncio.run(_run(args, port, server.pid))
        finally:
            stop_servers([server])
            os.sched_setaffinity(0, cpus)
        # The lease logic and the durable store alone, on the server's CPU.
        book_db = tmp / "book.db"
        command = [sys.executable, "-m", "bench.discovery_leases", "--book"]
        command += ["--fleet", str(fleet), "--db", str(book_db), "--clients", str(args.clients)]
        command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
        if pinned:
            command += ["--server-cpu", str(args.server_cpu)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        book = json.loads(done.stdout.splitlines()[-1])
        results.insert(
            2,
            PhaseResult(
                "no HTTP", book["pairs"], args.seconds, book["pair_ms"], [], {}, book["cpu"], {}
            ),
        )
        if not args.no_postgres:
            results += _postgres_phases(args, fleet, tmp, pinned)
    for result in results:
        print(result.line())
        busy = {n: c for n, c in sorted(result.threads.items()) if c > 0}
        if busy:
            print(
                "    server CPU per pair by thread: "
                + ", ".join(f"{n} {c / max(1, result.pairs) * 1e6:.0f} us" for n, c in busy.items())
            )
    if args.profile:
        import pstats

        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(25)
    _print_ratios(results)
    print(json.dumps([r.summary() for r in results]))


def _print_ratios(results: list[PhaseResult]) -> None:
    """The figures the goals are stated in, as ratios within this run."""
    by_name = {r.name: r for r in results}
    ceiling, leases = by_name["healthz x2"], by_name["grant+release"]
    ratio = leases.pairs_per_s / ceiling.pairs_per_s
    print(f"SQLite: grant+release at {ratio:.0%} of the /healthz ceiling (goal >= 70%)")
    for result in results:
        if result.name.startswith("paced"):
            p99 = result.summary()["pair_p99_ms"]
            print(f"open loop {result.name[6:]}: pair p99 {p99} ms (goal < 10 ms)")
    one, two = by_name.get("pg 1 replica"), by_name.get("pg 2 replicas")
    if one is not None:
        print(
            f"PostgreSQL: a replica's CPU per pair {one.cpu_us_per_pair:.0f} us, "
            f"{one.cpu_us_per_pair / leases.cpu_us_per_pair:.2f}x SQLite's "
            f"{leases.cpu_us_per_pair:.0f} us (goal <= 1.5x); PostgreSQL's own "
            f"{one.database_us_per_pair or 0:.0f} us"
        )
    if one is not None and two is not None:
        total_one = one.cpu_us_per_pair + (one.database_us_per_pair or 0)
        total_two = two.cpu_us_per_pair + (two.database_us_per_pair or 0)
        print(
            f"PostgreSQL: 2 replicas at {two.pairs_per_s / one.pairs_per_s:.2f}x one replica's "
            f"pairs/s; CPU per pair, replicas and PostgreSQL summed: {total_two:.0f} us with two, "
            f"{total_one:.0f} us with one ({total_two / total_one:.2f}x, goal <= 1.0x; "
            f"replicas {two.cpu_us_per_pair:.0f} against {one.cpu_us_per_pair:.0f}, "
            f"PostgreSQL {two.database_us_per_pair or 0:.0f} against "
            f"{one.database_us_per_pair or 0:.0f})"
        )
    shared = by_name.get(SHARED)
    if one is not None and two is not None and shared is not None:
        print(
            f"PostgreSQL: one replica whose core a busy process shares: {shared.cpu_us_per_pair:.0f} "
            f"us per pair ({shared.cpu_us_per_pair / one.cpu_us_per_pair:.2f}x alone; two "
            f"replicas sharing theirs: {two.cpu_us_per_pair / one.cpu_us_per_pair:.2f}x)"
        )


if __name__ == "__main__":
    main()
