"""The pure parts of discovery/connections.py: the connection cap, the raised
descriptor limit, and the log filter for handlers cancelled at a stop (the
connections themselves: tests/integration/test_discovery_connections.py)."""

from __future__ import annotations

import asyncio
import logging
import resource
import sys

import pytest

from discovery.connections import connection_cap, quiet_cancellations, raise_fd_limit


def test_the_cap_leaves_room_for_the_probes() -> None:
    assert connection_cap(1024, 256) == 1024 - 256 - 128 == 640
    assert connection_cap(65536, 256) == 65536 - 256 - 128
    assert connection_cap(300, 256) == 16  # a tiny limit still serves a few


@pytest.mark.parametrize(
    ("limits", "raised_to", "result"),
    [
        ((1024, 524288), 65536, (65536, 524288)),  # systemd's default: soft raised, not past 65536
        ((1024, 4096), 4096, (4096, 4096)),
        ((1024, 1024), None, (1024, 1024)),  # `ulimit -n 1024`: nothing to raise
        ((100000, 200000), None, (100000, 200000)),  # already higher: left alone
        ((1024, resource.RLIM_INFINITY), 65536, (65536, 65536)),
    ],
)
def test_the_soft_descriptor_limit_is_raised_towards_the_hard_one(
    monkeypatch: pytest.MonkeyPatch,
    limits: tuple[int, int],
    raised_to: int | None,
    result: tuple[int, int],
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits)
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: calls.append(value))
    assert raise_fd_limit() == result
    assert calls == ([] if raised_to is None else [(raised_to, limits[1])])


def test_tracebacks_of_handlers_cancelled_at_a_stop_are_dropped() -> None:
    logger = logging.Logger("uvicorn.error.test")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger.addHandler(Keep())
    quiet_cancellations(logger)
    quiet_cancellations(logger)  # once is enough
    assert len(logger.filters) == 1

    def log_with(error: BaseException) -> None:
        try:
            raise error
        except BaseException:
            logger.error("Exception in ASGI application\n", exc_info=sys.exc_info())

    log_with(asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded"))
    logger.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 3)
    log_with(RuntimeError("a real bug"))
    assert [r.getMessage() for r in seen] == [
        "Cancel 3 running task(s), timeout graceful shutdown exceeded",
        "Exception in ASGI application\n",
    ]
    assert seen[1].exc_info is not None and isinstance(seen[1].exc_info[1], RuntimeError)
