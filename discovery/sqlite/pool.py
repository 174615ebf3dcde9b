"""The SQLite book's free pool: the proxies that could be leased right now
(in the fleet, healthy, not leased), in the order grants take them. The
order is the lease contract's, the one the PostgreSQL store's index keeps:
never used ones first, by name, then least recently granted, ties by name.
Cooldowns are per target, so they are checked at pick time, not kept out
of the pool."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from sortedcontainers import SortedList  # type: ignore[import-untyped]

NEVER = -math.inf  # the last use of a proxy never leased


class FreePool:
    def __init__(self) -> None:
        self._order: SortedList[tuple[float, str]] = SortedList()
        self._keys: dict[str, tuple[float, str]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __iter__(self) -> Iterator[str]:
        return (name for _, name in self._order)

    def add(self, name: str, last_used: float | None) -> None:
        """Puts `name` in its place (None: never used). No-op when it is in."""
        if name in self._keys:
            return
        key = (NEVER if last_used is None else last_used, name)
        self._keys[name] = key
        self._order.add(key)

    def discard(self, name: str) -> None:
        key = self._keys.pop(name, None)
        if key is not None:
            self._order.remove(key)

    def pick(self, accept: Callable[[str], bool]) -> str | None:
        """Takes the first name in order that `accept` agrees to."""
        name: str
        for index, (_, name) in enumerate(self._order):
            if accept(name):
                del self._order[index]
                del self._keys[name]
                return name
        return None

    def rebuild(self, names: Iterable[tuple[str, float | None]]) -> None:
        """Replaces the pool with `names`: (name, last use or None)."""
        self._keys = {name: (NEVER if used is None else used, name) for name, used in names}
        self._order = SortedList(self._keys.values())


__all__ = ["FreePool"]
