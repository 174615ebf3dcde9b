"""An asyncio event loop on a controlled clock, for unit tests that assert
how far apart things happen.

``loop.time()`` starts at 0 and moves only when the loop would otherwise wait
for its next timer: that wait takes no wall time, the clock jumps to the
timer instead. Ready callbacks and I/O run as usual (the selector is polled
without blocking), so code under test sees exactly the loop times its
``sleep``/``call_later``/``asyncio.timeout`` asked for, however busy the
machine is. With no timer and nothing ready the loop blocks on its selector
as a real one does (e.g. for a thread handing a result back).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            return super().select(None)
        ready = super().select(0)
        if not ready and timeout > 0 and self.loop is not None:
            self.loop.advance(timeout)
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a :class:`VirtualClockLoop`."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coro)
