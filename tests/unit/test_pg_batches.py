"""discovery/postgres/batches.py: requests that arrive while a statement of
their kind is in flight are served by the next one, each with its own answer.
The statement is a fake that records its batches and is held open by the test
(no clock: the order of events is the test's)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest

from discovery.postgres.batches import Batches


class Statement:
    """Answers each request with its double; each run waits for `go`."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.go = asyncio.Event()
        self.fail: Exception | None = None
        self.short = False

    async def run(self, key: str, requests: Sequence[int]) -> list[int]:
        self.batches.append((key, list(requests)))
        await self.go.wait()
        if self.fail is not None:
            raise self.fail
        answers = [2 * r for r in requests]
        return answers[:-1] if self.short else answers


def sync(scenario: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(scenario)
    def test() -> None:
        asyncio.run(scenario())

    return test


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@sync
async def test_a_lone_request_goes_at_once_and_those_that_come_meanwhile_share_the_next() -> None:
    statement = Statement()
    batches = Batches(statement.run, most=10)
    first = asyncio.ensure_future(batches.submit("k", 1))
    await _settle()
    assert statement.batches == [("k", [1])]  # not held back for company
    later = [asyncio.ensure_future(batches.submit("k", n)) for n in (2, 3, 4)]
    await _settle()
    assert statement.batches == [("k", [1])]  # waiting: one statement in flight
    statement.go.set()
    assert await first == 2
    assert await asyncio.gather(*later) == [4, 6, 8]
    assert statement.batches == [("k", [1]), ("k", [2, 3, 4])]


@sync
async def test_a_batch_holds_at_most_most_and_kinds_never_mix() -> None:
    statement = Statement()
    batches = Batches(statement.run, most=2, in_flight=1)
    asked = [asyncio.ensure_future(batches.submit("a", n)) for n in range(1, 6)]
    other = asyncio.ensure_future(batches.submit("b", 10))
    await _settle()
    statement.go.set()
    assert await asyncio.gather(*asked) == [2, 4, 6, 8, 10]
    assert await other == 20
    assert [b for b in statement.batches if b[0] == "a"] == [
        ("a", [1, 2]),
        ("a", [3, 4]),
        ("a", [5]),
    ]
    assert ("b", [10]) in statement.batches  # its own statement, beside a's


@sync
async def test_in_flight_statements_of_one_kind_are_bounded() -> None:
    statement = Statement()
    batches = Batches(statement.run, most=1, in_flight=2)
    asked = [asyncio.ensure_future(batches.submit("k", n)) for n in range(4)]
    await _settle()
    assert len(statement.batches) == 2  # two in flight; two wait
    statement.go.set()
    assert await asyncio.gather(*asked) == [0, 2, 4, 6]
    assert len(statement.batches) == 4


@sync
async def test_a_failed_statement_fails_each_of_its_requests_and_the_next_still_runs() -> None:
    statement = Statement()
    batches = Batches(statement.run, most=10)
    statement.fail = RuntimeError("the database went away")
    first = [asyncio.ensure_future(batches.submit("k", n)) for n in (1, 2)]
    await _settle()
    statement.go.set()
    for request in first:
        with pytest.raises(RuntimeError, match="went away"):
            await request
    statement.fail = None
    assert await batches.submit("k", 3) == 6


@sync
async def test_a_waiter_that_gave_up_leaves_the_others_their_answers() -> None:
    statement = Statement()
    batches = Batches(statement.run, most=10)
    gone, kept = (asyncio.ensure_future(batches.submit("k", n)) for n in (1, 2))
    await _settle()
    gone.cancel()
    statement.go.set()
    assert await kept == 4
    assert gone.cancelled()


@sync
async def test_a_statement_that_answers_short_is_an_error_for_its_batch_not_a_hang() -> None:
    statement = Statement()
    batches = Batches(statement.run, most=10)
    statement.short = True
    asked = [asyncio.ensure_future(batches.submit("k", n)) for n in (1, 2)]
    await _settle()
    statement.go.set()
    for request in asked:
        with pytest.raises(RuntimeError, match="1 answers for a batch of 2"):
            await request


@pytest.mark.parametrize(("most", "in_flight"), [(0, 1), (1, 0)])
def test_bounds_below_one_are_refused(most: int, in_flight: int) -> None:
    async def run(_key: str, requests: Sequence[int]) -> list[int]:
        return list(requests)

    with pytest.raises(ValueError, match="at least 1"):
        Batches(run, most=most, in_flight=in_flight)
