"""A brake on guessing the token (docs/discovery.md, "Auth").

Every wrong token (a bearer header on /v1/* or /ui/api/status, the status
page's login form) counts against the client's address. The first
FREE_FAILURES in a row cost nothing; each one after that closes the address
for BASE_DELAY_S, doubled per failure up to MAX_DELAY_S. While closed, the
address gets 429 with Retry-After and its tokens are not even compared, so
answers tell a guesser nothing faster than the brake allows. A right token
(once the address is open again) clears its record.

Addresses are counted per IPv4 address and per IPv6 /64 (one host usually
holds a whole /64). The table is bounded: MAX_ADDRESSES records at most, the
oldest dropped first, and a record is forgotten FORGET_AFTER_S after its
last failure. Failures are logged at most once per address per LOG_EVERY_S
(with how many went unlogged meanwhile), and at most MAX_WARNINGS lines per
LOG_EVERY_S in all; the token given is never logged.

In memory, per process: each replica brakes the requests it answers.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Scope

from discovery.logs import event

log = logging.getLogger("discovery.auth")

FREE_FAILURES = 5
BASE_DELAY_S = 1.0
MAX_DELAY_S = 60.0
FORGET_AFTER_S = 15 * 60.0
MAX_ADDRESSES = 10_000
LOG_EVERY_S = 60.0
MAX_WARNINGS = 20


@dataclass
class _Record:
    failures: int = 0
    closed_until: float = 0.0
    last_failure: float = 0.0
    logged_at: float = -math.inf
    unlogged: int = 0  # failures since this address's last warning
    refused: int = 0  # 429s since this address's last warning


def client_key(address: str | None) -> str:
    """What failures are counted by: the IPv4 address, the IPv6 /64."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]  # not an IP (a test client, a socket path)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def scope_address(scope: Scope) -> str | None:
    """The client's address as uvicorn gives it (X-Forwarded-For from a trusted
    proxy already applied)."""
    client = scope.get("client")
    return str(client[0]) if client else None


class Brake:
    """Per-address backoff on wrong tokens; `clock` is monotonic seconds."""

    def __init__(
        self,
        *,
        free_failures: int = FREE_FAILURES,
        base_delay: float = BASE_DELAY_S,
        max_delay: float = MAX_DELAY_S,
        forget_after: float = FORGET_AFTER_S,
        max_addresses: int = MAX_ADDRESSES,
        log_every: float = LOG_EVERY_S,
        max_warnings: int = MAX_WARNINGS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free_failures = free_failures
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.forget_after = max(forget_after, max_delay)  # never forget a closed address
        self.max_addresses = max_addresses
        self.log_every = log_every
        self.max_warnings = max_warnings
        self._clock = clock
        # Oldest failure first: what is forgotten or dropped first.
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._window_start = -math.inf
        self._warnings = 0
        self._held_back = 0  # warnings the bound on all addresses kept from the log

    def __len__(self) -> int:
        return len(self._records)

    def retry_after(self, address: str | None) -> int:
        """Whole seconds until `address` may present a token again (0: now)."""
        if not self._records:  # the common case costs one test
            return 0
        record = self._records.get(client_key(address))
        if record is None:
            return 0
        wait = record.closed_until - self._clock()
        if wait <= 0:
            return 0
        record.refused += 1
        return max(1, math.ceil(wait))

    def succeeded(self, address: str | None) -> None:
        if self._records:
            self._records.pop(client_key(address), None)

    def failed(self, address: str | None, via: str) -> int:
        """Counts a wrong token from `address`; the seconds it is now closed for."""
        now = self._clock()
        self._forget(now)
        key = client_key(address)
        record = self._records.pop(key, None)
        if record is None:
            record = _Record()
            while len(self._records) >= self.max_addresses:
                self._records.popitem(last=False)
        self._records[key] = record
        record.failures += 1
        record.last_failure = now
        record.unlogged += 1
        delay = 0.0
        if record.failures >= self.free_failures:
            doublings = min(record.failures - self.free_failures, 32)
            delay = min(self.max_delay, self.base_delay * 2.0**doublings)
            record.closed_until = now + delay
        self._warn(key, record, via, delay, now)
        return math.ceil(delay)

    def _forget(self, now: float) -> None:
        while self._records:
            record = next(iter(self._records.values()))
            if record.last_failure + self.forget_after > now:
                return
            self._records.popitem(last=False)

    def _warn(self, key: str, record: _Record, via: str, delay: float, now: float) -> None:
        if now - record.logged_at < self.log_every:
            return
        if now - self._window_start >= self.log_every:
            self._window_start, self._warnings = now, 0
        if self._warnings >= self.max_warnings:
            self._held_back += 1  # this address's count goes on: it shows in its next line
            return
        self._warnings += 1
        event(
            log,
            logging.WARNING,
            "wrong token",
            client=key,
            via=via,
            failures=record.failures,
            unlogged=record.unlogged - 1,
            refused=record.refused,
            closed_for_s=math.ceil(delay),
            warnings_held_back=self._held_back,
        )
        record.logged_at, record.unlogged, record.refused = now, 0, 0
        self._held_back = 0


__all__ = ["Brake", "client_key", "scope_address"]
