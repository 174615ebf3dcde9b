"""Many requests, one statement: requests of one kind that arrive while a
statement of that kind is in flight wait for the next one, which serves
them all (at most `most` at once).

Why: on PostgreSQL a replica's CPU per lease went to the driver, the pool
and the event loop, once per statement (a grant and a release are one
statement each), not to the lease rules; a statement that serves fifty
grants costs barely more than one that serves one (docs/discovery.md,
"Performance"). Nothing waits on a timer: a request that finds nothing in
flight goes at once, alone, so an idle service answers as fast as before,
and batches grow only with the load that makes them pay.

Invariants: every submitted request gets exactly the answer its batch gave
for it, or the error the whole batch raised; a batch never holds more than
`most`; at most `in_flight` statements of one kind run at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
Req = TypeVar("Req")
Ans = TypeVar("Ans")


class Batches(Generic[K, Req, Ans]):
    def __init__(
        self,
        run: Callable[[K, Sequence[Req]], Awaitable[Sequence[Ans]]],
        *,
        most: int,
        in_flight: int = 1,
    ) -> None:
        if most < 1 or in_flight < 1:
            raise ValueError(f"most ({most}) and in_flight ({in_flight}) must be at least 1")
        self._run = run
        self._most = most
        self._in_flight = in_flight
        self._waiting: dict[K, list[tuple[Req, asyncio.Future[Ans]]]] = {}
        self._running: dict[K, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # kept: the loop holds tasks weakly

    async def submit(self, key: K, request: Req) -> Ans:
        """The answer to REQUEST, from the next statement of kind KEY."""
        answer: asyncio.Future[Ans] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((request, answer))
        if self._running.get(key, 0) < self._in_flight:
            self._running[key] = self._running.get(key, 0) + 1
            task = asyncio.get_running_loop().create_task(self._drain(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await answer

    async def _drain(self, key: K) -> None:
        try:
            while waiting := self._waiting.get(key):
                batch, rest = waiting[: self._most], waiting[self._most :]
                if rest:
                    self._waiting[key] = rest
                else:
                    del self._waiting[key]
                await self._answer(key, batch)
        finally:
            self._running[key] -= 1
            if not self._running[key]:
                del self._running[key]

    async def _answer(self, key: K, batch: list[tuple[Req, asyncio.Future[Ans]]]) -> None:
        try:
            answers = list(await self._run(key, [request for request, _ in batch]))
            if len(answers) != len(batch):
                raise RuntimeError(f"{len(answers)} answers for a batch of {len(batch)}")
        except asyncio.CancelledError:
            for _, answer in batch:
                answer.cancel()
            raise
        except Exception as error:  # each waiter raises it, as if it had run alone
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(error)
            return
        for (_, answer), value in zip(batch, answers, strict=True):
            if not answer.done():  # a waiter cancelled meanwhile has gone
                answer.set_result(value)


__all__ = ["Batches"]
