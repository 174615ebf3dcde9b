"""The crawler client's time, moved by the test: a `Clock` and a `Sleep`
(egress_proxies_client._leasing) that let a test step the renew loop one
sleep at a time, however slow the machine.

Each `sleep()` parks until the test calls `wake()`, which moves the time by
what that sleep asked and lets it go on. The client's loop runs on another
thread (lease()'s own, or a LoopThread the test drives), the test waits for
it with `next_sleep()`. tests/support/virtual_clock.py jumps to the next
timer whenever its loop is idle; that does not fit here, where the loop also
waits for sockets and other threads (a renewal through a server), so the
time would jump while a renewal is under way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

EPOCH = 1_900_000_000.0  # whole seconds: the service's lease ends are exact sums of it


@dataclass(eq=False)
class _Parked:
    loop: asyncio.AbstractEventLoop
    woken: asyncio.Future[None]
    seconds: float


class StoppedClock:
    """`time()` is EPOCH plus the time moved so far, `monotonic()` the time
    moved so far; `asked` lists every sleep's seconds, in order."""

    def __init__(self) -> None:
        self._moved = 0.0
        self.asked: list[float] = []
        self._parked: list[_Parked] = []
        self._changed = threading.Condition()

    def time(self) -> float:
        return EPOCH + self._moved

    def monotonic(self) -> float:
        return self._moved

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        parked = _Parked(loop, loop.create_future(), seconds)
        with self._changed:
            self.asked.append(seconds)
            self._parked.append(parked)
            self._changed.notify_all()
        try:
            await parked.woken
        finally:
            with self._changed:
                if parked in self._parked:  # cancelled while parked
                    self._parked.remove(parked)
                self._changed.notify_all()

    def next_sleep(self, ended: Callable[[], bool] = lambda: False, timeout: float = 30.0) -> float:
        """Waits until the client sleeps (returns the seconds it asked) or
        `ended()`, which returns 0.0. `timeout` is a guard against a client
        that stopped: what it measures is never asserted."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._parked:
                if ended():
                    return 0.0
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the client never slept again (asked so far: {self.asked})"
                    )
                self._changed.wait(0.01)
            return self._parked[0].seconds

    def wake(self) -> None:
        """Moves the time by what the parked sleep asked and lets it go on."""
        with self._changed:
            parked = self._parked.pop(0)
            self._moved += parked.seconds
        parked.loop.call_soon_threadsafe(_resolve, parked.woken)

    def sleeping(self) -> int:
        with self._changed:
            return len(self._parked)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
