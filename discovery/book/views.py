"""The JSON the API answers with, built the same way from either store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from discovery.book.contract import Lease
from discovery.book.rules import round_latency
from discovery.fleet import FleetProxy

T = TypeVar("T")
TURN = 256  # proxies built per turn of the event loop (taking_turns)


def rfc3339(timestamp: float) -> str:
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def taking_turns(items: Iterable[T], every: int = TURN) -> AsyncIterator[T]:
    """`items`, letting the event loop serve others every `every` of them: the
    whole fleet as JSON (10,000 proxies: about 100 ms) must not hold every
    grant and release up for that long. Callers iterate over a copy, so a
    fleet reloaded meanwhile does not change what they walk."""
    for index, item in enumerate(items):
        if index and index % every == 0:
            await asyncio.sleep(0)
        yield item


def lease_json(lease: Lease) -> dict[str, Any]:
    return {
        "id": lease.id,
        "holder": lease.holder,
        "proxy": {"name": lease.proxy.name, "url": lease.proxy.url},
        "expiresAt": rfc3339(lease.expires_at),
    }


@dataclass(frozen=True)
class ProxyDetail:
    """What the status page shows beyond `GET /v1/proxies`."""

    lease: tuple[str, float] | None  # (holder, expires at)
    recent_ms: Sequence[float | None]  # the latest probes' times, oldest first


def proxy_json(
    proxy: FleetProxy,
    *,
    health: str,
    latency_ms: float | None,
    last_error: str | None,
    leased: bool,
    cooldowns: list[tuple[float, str]],
    detail: ProxyDetail | None = None,
) -> dict[str, Any]:
    """One proxy in `GET /v1/proxies` (with `detail`: on the status page):
    never its credentials."""
    if last_error and proxy.password:
        # The engine should never put a password in an error; make sure.
        last_error = last_error.replace(proxy.password, "[redacted]")
    answer: dict[str, Any] = {
        "name": proxy.name,
        "provider": proxy.provider,
        "type": proxy.type,
        "zone": proxy.zone,
        "labels": dict(proxy.labels),
        "health": health,
        "latencyMs": round_latency(latency_ms),
        "lastError": last_error,
        "leased": leased,
        "cooldowns": [{"target": t, "until": rfc3339(u)} for u, t in sorted(cooldowns)],
    }
    if detail is not None:
        answer["lease"] = (
            {"holder": detail.lease[0], "expiresAt": rfc3339(detail.lease[1])}
            if detail.lease is not None
            else None
        )
        answer["recentMs"] = list(detail.recent_ms)
    return answer


__all__ = ["TURN", "ProxyDetail", "lease_json", "proxy_json", "rfc3339", "taking_turns"]
