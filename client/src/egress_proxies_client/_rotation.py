"""What the httpx transports and the Scrapy middleware do with an answer that
came through a leased proxy, once for both: the verdict (`_bans.verdict`),
the report it calls for, and whether the request may go once more through
another proxy."""

from __future__ import annotations

from collections.abc import Mapping

from egress_proxies_client._bans import BanDetector, verdict
from egress_proxies_client._pool import Counter, Held, LeasePool
from egress_proxies_client._protocol import Outcome


class Rotation:
    """`settle()` judges an answer and reports a bad one (`blocked`: the site
    banned the proxy; `error`: the proxy refused its credentials), which
    drops the proxy for the site; `again(tries)` says whether a request sent
    `tries` times more already after such answers may be sent once more
    (at most `ban_retries` times). Counts `bans`, `retries` and
    `retries/exhausted`."""

    def __init__(
        self, pool: LeasePool, policy: BanDetector, *, ban_retries: int, count: Counter
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.ban_retries = ban_retries
        self._count = count

    async def settle(
        self, held: Held | None, status: int, headers: Mapping[str, str], body: bytes
    ) -> Outcome:
        """The answer's verdict, reported through `held` (None: dropped already)."""
        outcome = verdict(self.policy, status, headers, body)
        if outcome == "blocked":
            self._count("bans", 1)
            if held is not None:
                await self.pool.blocked(held)
        elif outcome == "error" and held is not None:
            await self.pool.failed(held)
        return outcome

    def again(self, tries: int) -> bool:
        if tries >= self.ban_retries:
            self._count("retries/exhausted", 1)
            return False
        self._count("retries", 1)
        return True


def reason(outcome: Outcome, status: int) -> str:
    """Why an answer was not passed on, for the log."""
    if outcome == "error":
        return f"the proxy refused its credentials ({status})"
    return f"banned ({status})"
