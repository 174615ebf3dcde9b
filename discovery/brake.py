"""A brake on guessing the token (docs/discovery.md, "Auth").

Every wrong token counts against the client's address. Its first
FREE_FAILURES are compared at once; from the FREE_FAILURES-th on, each
closes the address for BASE_DELAY_S, doubled per failure up to MAX_DELAY_S.
While closed, the address gets 429 with Retry-After and its tokens are not
even compared, so answers tell a guesser nothing faster than the brake
allows.

Known sources. An address that presented the right token in the last
KNOWN_FOR_S is known (MAX_KNOWN of them, the least recently right dropped
first): its tokens are always compared, closed or not, so a client with the
token is never refused for the failures of another client behind the same
address (a NAT, a shared host). The price: a guesser sharing a known address
is not slowed; it needs the address of a client that has the token. Known
sources are remembered by their exact address, failures by IPv4 address or
IPv6 /64 (one host usually holds a whole /64): another host of a known /64 is
braked as any other.

Surge. Beyond SURGE_FAILURES wrong tokens in about SURGE_WINDOW_S over all
addresses (a counter that decays with that time constant), every unknown
source waits (429, its token not compared) until the count falls back below:
a guesser rotating over more addresses than the table holds, or over the
/64s of a /48, gets about SURGE_FAILURES / SURGE_WINDOW_S guesses a second,
no more. Known sources are compared during a surge all the same.

Memory is bounded: MAX_ADDRESSES failure records at most, the oldest failure
dropped first, a record forgotten FORGET_AFTER_S after its last failure; the
known table; the surge's two numbers. Failures are logged at most once per
address per LOG_EVERY_S (with how many went unlogged meanwhile), MAX_WARNINGS
lines per LOG_EVERY_S in all, a surge once per LOG_EVERY_S; the token given
is never logged.

In memory, per process and per Brake: each replica brakes the requests it
answers, and the status page's login form has a Brake of its own (its
failures never slow the API).
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
KNOWN_FOR_S = 60 * 60.0
MAX_KNOWN = 10_000
SURGE_FAILURES = 600
SURGE_WINDOW_S = 60.0
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


class _Surge:
    """Wrong tokens over all addresses, as a count that decays by e every
    `window` seconds: a steady rate r holds it near r * window. A few
    numbers, whatever the number of addresses."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self.level = 0.0
        self.at = -math.inf
        self.until = -math.inf  # when the level falls back to the limit
        self.refused = 0  # unknown sources refused since the last warning
        self.logged_at = -math.inf

    def add(self, now: float) -> None:
        self.level = self.level * math.exp(min(0.0, self.at - now) / self.window) + 1.0
        self.at = now
        if self.level > self.limit:
            self.until = now + self.window * math.log(self.level / self.limit)

    def level_at(self, now: float) -> float:
        return self.level * math.exp(min(0.0, self.at - now) / self.window)


class Brake:
    """Per-address backoff on wrong tokens, known sources always compared, a
    surge that slows every unknown source; `clock` is monotonic seconds.

    Callers ask `retry_after` before comparing a token (> 0: answer 429
    without comparing), then tell `succeeded` or `failed`."""

    def __init__(
        self,
        *,
        free_failures: int = FREE_FAILURES,
        base_delay: float = BASE_DELAY_S,
        max_delay: float = MAX_DELAY_S,
        forget_after: float = FORGET_AFTER_S,
        max_addresses: int = MAX_ADDRESSES,
        known_for: float = KNOWN_FOR_S,
        max_known: int = MAX_KNOWN,
        surge_failures: int = SURGE_FAILURES,
        surge_window: float = SURGE_WINDOW_S,
        log_every: float = LOG_EVERY_S,
        max_warnings: int = MAX_WARNINGS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free_failures = free_failures
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.forget_after = max(forget_after, max_delay)  # never forget a closed address
        self.max_addresses = max_addresses
        self.known_for = known_for
        self.max_known = max_known
        self.log_every = log_every
        self.max_warnings = max_warnings
        self._clock = clock
        # Oldest failure first: what is forgotten or dropped first.
        self._records: OrderedDict[str, _Record] = OrderedDict()
        # Exact address -> until when it is known; the least recently right first.
        self._known: OrderedDict[str, float] = OrderedDict()
        self._surge = _Surge(surge_failures, surge_window)
        self._window_start = -math.inf
        self._warnings = 0
        self._held_back = 0  # warnings the bound on all addresses kept from the log

    def __len__(self) -> int:
        return len(self._records)

    @property
    def known(self) -> int:
        """How many addresses are known (presented the right token lately)."""
        return len(self._known)

    def retry_after(self, address: str | None) -> int:
        """Whole seconds until `address` may present a token again (0: now)."""
        now = self._clock()
        if not self._records and now >= self._surge.until:  # the common case
            return 0
        if self._is_known(address, now):
            return 0
        record = self._records.get(client_key(address))
        closed = record.closed_until - now if record is not None else 0.0
        wait = max(closed, min(self._surge.until - now, self.max_delay))
        if wait <= 0:
            return 0
        if record is not None and closed > 0:
            record.refused += 1
        else:
            self._surge.refused += 1
        return max(1, math.ceil(wait))

    def closed(self, address: str | None) -> bool:
        """Whether `address` itself is closed by its own failures (else a
        refusal by `retry_after` was the surge's)."""
        record = self._records.get(client_key(address))
        return record is not None and record.closed_until > self._clock()

    def refusal_detail(self, address: str | None, wait: int) -> str:
        """The 429's detail for `address`, refused for `wait` s by `retry_after`."""
        key = client_key(address)
        if self.closed(address):
            return f"too many wrong tokens from {key}: no token is checked for {wait} s"
        return (
            f"too many wrong tokens from many addresses: no token from {key} is checked "
            f"for {wait} s (only from addresses that presented the right one lately)"
        )

    def succeeded(self, address: str | None) -> None:
        """`address` presented the right token: it is known for `known_for` s.
        Its count of failures is kept: another client of the same address or
        /64 is not let off by this one's success."""
        key = address or ""
        self._known[key] = self._clock() + self.known_for
        self._known.move_to_end(key)
        if len(self._known) > self.max_known:
            self._known.popitem(last=False)

    def failed(self, address: str | None, via: str) -> int:
        """Counts a wrong token from `address`; the seconds it is now closed for."""
        now = self._clock()
        self._forget(now)
        self._surge.add(now)
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
        self._warn_surge(via, now)
        return math.ceil(delay)

    def _is_known(self, address: str | None, now: float) -> bool:
        until = self._known.get(address or "")
        if until is None:
            return False
        if until > now:
            return True
        del self._known[address or ""]
        return False

    def _forget(self, now: float) -> None:
        while self._records:
            record = next(iter(self._records.values()))
            if record.last_failure + self.forget_after > now:
                break
            self._records.popitem(last=False)
        while self._known:
            until = next(iter(self._known.values()))
            if until > now:
                break
            self._known.popitem(last=False)

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

    def _warn_surge(self, via: str, now: float) -> None:
        surge = self._surge
        if now >= surge.until or now - surge.logged_at < self.log_every:
            return
        event(
            log,
            logging.WARNING,
            "wrong tokens from many addresses",
            via=via,
            recent_failures=round(surge.level_at(now)),
            limit=surge.limit,
            unknown_closed_for_s=math.ceil(min(surge.until - now, self.max_delay)),
            refused=surge.refused,
            addresses=len(self._records),
        )
        surge.logged_at, surge.refused = now, 0


__all__ = ["Brake", "client_key", "scope_address"]
