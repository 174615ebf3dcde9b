"""The fleet shared between replicas, as bench/health_probes.py measures it:
the proxies split by discovery/postgres/sharing.py's rule over live slots
0..n-1 (what n replicas on PostgreSQL hold), one process per replica, each
pinned to a core of its own where there is one, running the health engine
on its share on uvloop (a replica's loop). The replicas' steady-state
intervals run at the same time (a barrier after their first rounds), so they
also share the machine with the responder as they would in production."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier

from bench._probe_rounds import Steady, steady_state, use_loop
from discovery.postgres.sharing import share
from health.model import ProxyEndpoint


def _replica(
    slot: int,
    fleet: list[ProxyEndpoint],
    args: argparse.Namespace,
    core: int,
    barrier: Barrier,
    out: Connection,
) -> None:
    os.sched_setaffinity(0, {core})
    use_loop("uvloop")
    result = asyncio.run(
        steady_state(fleet, args, f"replica {slot}", settled=lambda: barrier.wait(300))
    )
    out.send(result)
    out.close()


def shared(
    fleet: list[ProxyEndpoint], args: argparse.Namespace, replicas: int
) -> list[tuple[int, Steady]]:
    """(slot, its steady state) per replica, over one interval at the same time."""
    slots = list(range(replicas))
    names = [e.name for e in fleet]
    cores = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
    context = multiprocessing.get_context("fork")  # no event loop runs here now
    barrier = context.Barrier(replicas)
    running = []
    for slot in slots:
        mine = share(names, slot, slots)
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_replica,
            args=(
                slot,
                [e for e in fleet if e.name in mine],
                args,
                cores[slot % len(cores)],
                barrier,
                send,
            ),
        )
        process.start()
        running.append((slot, process, receive))
    results = []
    for slot, process, receive in running:
        results.append((slot, receive.recv()))
        process.join(60)
    return results
