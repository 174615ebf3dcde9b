"""A crawl with the httpx transports of the installed egress-proxies-client,
run by the crawler tests with the clean virtualenv's Python (nothing of the
project importable):

    python httpx_crawl.py '{"mode": "sync", "service": URL, "base": URL, ...}'

Modes: `sync` (DiscoveryTransport, `in_flight` threads), `async`
(AsyncDiscoveryTransport, `in_flight` at once), `nowhere` (a selector no
proxy matches: the error the client raises). Prints one JSON object:
each page's status and text, the transport's stats, whether leases were
held while the client was open, and the error, if any.
"""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from egress_proxies_client import AsyncDiscoveryTransport, DiscoveryTransport, NoProxyAvailable


def sync_crawl(job: dict[str, Any]) -> dict[str, Any]:
    transport = DiscoveryTransport(job["service"], token=job["token"], **job.get("options", {}))
    with httpx.Client(transport=transport, timeout=20) as http:
        with ThreadPoolExecutor(job["in_flight"]) as pool:
            answers = list(
                pool.map(lambda n: http.get(f"{job['base']}/page/{n}"), range(job["pages"]))
            )
        held = bool(transport.pool.leases())
    return result(answers, dict(transport.stats), held)


def async_crawl(job: dict[str, Any]) -> dict[str, Any]:
    transport = AsyncDiscoveryTransport(
        job["service"], token=job["token"], **job.get("options", {})
    )

    async def crawl() -> tuple[list[httpx.Response], bool]:
        gate = asyncio.Semaphore(job["in_flight"])
        async with httpx.AsyncClient(transport=transport, timeout=20) as http:

            async def get(page: int) -> httpx.Response:
                async with gate:
                    return await http.get(f"{job['base']}/page/{page}")

            answers = await asyncio.gather(*(get(n) for n in range(job["pages"])))
            return list(answers), bool(transport.pool.leases())

    answers, held = asyncio.run(crawl())
    return result(answers, dict(transport.stats), held)


def nowhere(job: dict[str, Any]) -> dict[str, Any]:
    transport = DiscoveryTransport(
        job["service"], token=job["token"], labels={"pool": "nowhere"}, wait=1.0
    )
    with httpx.Client(transport=transport) as http:
        try:
            http.get(f"{job['base']}/page/0")
        except NoProxyAvailable as exc:
            return {"error": str(exc), "stats": dict(transport.stats)}
    return {"error": None, "stats": dict(transport.stats)}


def result(answers: list[httpx.Response], stats: dict[str, int], held: bool) -> dict[str, Any]:
    return {
        "pages": [[a.status_code, a.text] for a in answers],
        "stats": stats,
        "held_while_open": held,
    }


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    run = {"sync": sync_crawl, "async": async_crawl, "nowhere": nowhere}[job["mode"]]
    print(json.dumps(run(job)))
