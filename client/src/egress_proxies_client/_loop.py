"""An asyncio event loop in a daemon thread, for the sync side: `lease()` and
`DiscoveryTransport` run the async code on it instead of a second copy of
it. Daemon: a forgotten close() never keeps the process from exiting (its
leases then end at their TTL)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

R = TypeVar("R")


class LoopThread:
    def __init__(self, name: str = "egress-proxies-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        """Runs `coroutine` on the loop and waits for its result (or exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
