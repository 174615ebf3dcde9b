"""conflicts.retrying: a statement PostgreSQL aborted to break a deadlock runs
again, at most ATTEMPTS times; any other error goes to the caller at once.
(Against a real deadlock: tests/integration/test_discovery_pg_deadlock.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from discovery.book.errors import StoreError
from discovery.postgres.conflicts import ATTEMPTS, StoreConflict, retrying


def _failing(
    errors: list[Exception], answer: str = "done"
) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return answer

    return calls, work


def test_a_conflict_runs_the_statement_again() -> None:
    calls, work = _failing([StoreConflict("deadlock detected")])
    assert asyncio.run(retrying(work)) == "done"
    assert len(calls) == 2


def test_conflicts_past_the_attempts_reach_the_caller() -> None:
    calls, work = _failing([StoreConflict(f"deadlock {n}") for n in range(ATTEMPTS + 1)])
    with pytest.raises(StoreConflict, match=f"deadlock {ATTEMPTS - 1}"):
        asyncio.run(retrying(work))
    assert len(calls) == ATTEMPTS


def test_any_other_store_error_is_not_run_again() -> None:
    calls, work = _failing([StoreError("connection refused")])
    with pytest.raises(StoreError, match="connection refused"):
        asyncio.run(retrying(work))
    assert len(calls) == 1
