"""How a lease is had and kept: the one grant-and-wait loop and the one renew
loop, which `alease()` / `lease()` and the pool (so the httpx transports and
the Scrapy middleware) all run.

Granting (`ask`, `within`): a 409 says when to ask again (Retry-After, with
a little jitter); a service that cannot be reached is asked again after
UNREACHABLE_PAUSE; both are waited for up to `wait` seconds, then
NoProxyAvailable names the last reason. A refusal no waiting changes (400,
401, 429: DiscoveryError) is raised at once.

Renewing (`keep`): at a third of the time the lease has left, so two more
chances remain before it ends. A failed renewal (the service unreachable, or
an error answer) never stops the renewals: the next try comes after a
backoff that doubles from FIRST_BACKOFF up to MAX_BACKOFF, and never later
than a third of what is left. The lease is lost when the service says it
ended (404) or when it ran out while no renewal got through. A renewal that
names another proxy URL is taken (the proxy moved).

Time is read from a `Clock` (the `time` module unless one is given), and
waited out through a `Sleep`: the two seams that let a test move time
itself instead of waiting for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeVar

import httpx

from egress_proxies_client._api import LeaseApi
from egress_proxies_client._errors import DiscoveryError, NoProxyAvailable
from egress_proxies_client._protocol import Denied, Granted

logger = logging.getLogger("egress_proxies_client")

Sleep = Callable[[float], Awaitable[None]]
T = TypeVar("T")


class Clock(Protocol):
    """Where the loops read the time: `time()` (epoch seconds, what a lease's
    end is compared with: the service's ends are epoch times) and
    `monotonic()` (when to ask again or renew: never moved by a clock
    change). The `time` module is one."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


SYSTEM_CLOCK: Final[Clock] = time

UNREACHABLE_PAUSE = 1.0  # seconds before asking an unreachable service again
MIN_PAUSE = 0.2  # no renewal sooner than this after the last one
FIRST_BACKOFF = 0.5  # after one failed renewal; doubles with each one more
MAX_BACKOFF = 5.0
_TICK = 0.05  # the shortest sleep of a waiting loop


@dataclass(frozen=True)
class Refusal:
    """No lease now: ask again at `at` (the clock's monotonic()); `retry_after` and
    `detail` say when and why, as NoProxyAvailable will. `denied`: the
    service answered 409 (else it could not be reached)."""

    at: float
    retry_after: float
    detail: str
    denied: bool = True


NOT_REFUSED = Refusal(0.0, 0.0, "")


async def ask(
    api: LeaseApi, body: dict[str, object], clock: Clock = SYSTEM_CLOCK
) -> Granted | Refusal:
    """One grant: the lease, or when to ask again."""
    try:
        answer = await api.grant(body)
    except httpx.TransportError as exc:
        detail = f"the discovery service at {api.base_url} is unreachable ({exc!r})"
        logger.warning("%s", detail)
        pause = UNREACHABLE_PAUSE
        return Refusal(clock.monotonic() + pause, pause, detail, denied=False)
    if isinstance(answer, Denied):
        return Refusal(clock.monotonic() + answer.pause(), answer.retry_after, answer.detail)
    return answer


async def within(
    wait: float,
    sleep: Sleep,
    what: str,
    attempt: Callable[[], Awaitable[T | Refusal]],
    clock: Clock = SYSTEM_CLOCK,
) -> T:
    """`attempt()` again at each refusal's time until it gives something, for
    at most `wait` seconds; then NoProxyAvailable (`what`: "for shop.example")."""
    deadline = clock.monotonic() + wait
    while True:
        got = await attempt()
        if not isinstance(got, Refusal):
            return got
        left = deadline - clock.monotonic()
        if left <= 0:
            raise NoProxyAvailable(
                f"no proxy {what} after waiting {wait:g} s: {got.detail}", got.retry_after
            )
        await sleep(min(left, max(_TICK, got.at - clock.monotonic())))


def renew_pause(left: float, failures: int) -> float:
    """Seconds from now to the next renewal of a lease with `left` seconds
    to run, after `failures` failed renewals in a row (see the module's doc)."""
    pause = left / 3
    if failures:
        pause = min(pause, MAX_BACKOFF, FIRST_BACKOFF * 2 ** (failures - 1))
    return max(MIN_PAUSE, pause)


class Kept(Protocol):
    """A lease as the renew loop sees it (the pool's Held, alease()'s handle)."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    def seconds_left(self) -> float: ...

    def refresh(self, renewed: Granted) -> None:
        """Takes the renewal's end and proxy URL."""
        ...


def _never_idle() -> float | None:
    return None


async def keep(
    api: LeaseApi,
    lease: Kept,
    sleep: Sleep,
    *,
    clock: Clock = SYSTEM_CLOCK,
    idle_in: Callable[[], float | None] = _never_idle,
) -> Literal["lost", "idle"]:
    """Renews `lease` until it is lost, or until `idle_in()` (seconds until
    the lease counts as unused; None: never) is 0 or less: says which. Cancel
    the task to stop it sooner."""
    failures = 0
    while True:
        due = clock.monotonic() + renew_pause(lease.seconds_left(), failures)
        while True:
            idle = idle_in()
            if idle is not None and idle <= 0:
                return "idle"
            now = clock.monotonic()
            if now >= due:
                break
            await sleep(max(_TICK, due - now if idle is None else min(due - now, idle)))
        try:
            renewed = await api.renew(lease.id)
        except (httpx.TransportError, DiscoveryError) as exc:
            failures += 1
            if lease.seconds_left() <= 0:
                logger.warning("the lease of %s ran out unrenewed (%s)", lease.name, exc)
                return "lost"
            logger.warning("renewing the lease of %s failed (%s); trying again", lease.name, exc)
            continue
        if renewed is None:
            return "lost"
        lease.refresh(renewed)
        failures = 0
