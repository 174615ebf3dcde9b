"""The pure parts of discovery/connections.py: the connection cap, the raised
descriptor limit, the log filter for handlers cancelled at a stop, and the
head size limit, read by read, on the protocol with a transport of the
test's (the connections over sockets: tests/integration/test_discovery_connections.py)."""

from __future__ import annotations

import asyncio
import logging
import resource
import sys

import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from discovery.connections import (
    MAX_HEAD_BYTES,
    ConnectionGuard,
    connection_cap,
    protocol_class,
    quiet_cancellations,
    raise_fd_limit,
)


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


# -- the head size limit, read by read ---------------------------------------------------------


class Transport(asyncio.Transport):
    """What the protocol writes, and whether it closed the connection."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def head(size: int, method: bytes = b"GET") -> bytes:
    """A complete request head of about `size` bytes, in 1 KB headers."""
    lines = [method + b" / HTTP/1.1\r\n", b"Host: x\r\n"]
    while sum(map(len, lines)) < size:
        lines.append(b"X-Filler-%05d: " % len(lines) + b"f" * 1000 + b"\r\n")
    return b"".join(lines) + b"\r\n"


def feed(*reads: bytes) -> tuple[bytes, bool, int, float]:
    """The reads given to one connection, each as one `data_received`: what was
    written back, whether it was closed, the requests the app saw, and the
    head_too_large count."""
    calls = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["path"])
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def run() -> tuple[bytes, bool, int, float]:
        guard = ConnectionGuard(max_connections=10, registry=CollectorRegistry())
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        protocol = protocol_class(guard)(config, ServerState(), {}, asyncio.get_running_loop())
        transport = Transport()
        protocol.connection_made(transport)
        for data in reads:
            protocol.data_received(data)
            for _ in range(5):
                await asyncio.sleep(0)  # the app's task, if one was started
        closed = transport.closed  # before the client goes away
        protocol.connection_lost(None)
        count = guard.registry.get_sample_value(
            "discovery_connections_closed_total", {"reason": "head_too_large"}
        )
        return transport.written, closed, len(calls), count or 0.0

    return asyncio.run(run())


def test_a_head_over_the_limit_in_one_read_gets_431() -> None:
    written, closed, requests, count = feed(head(70 * 1024))
    assert written.startswith(b"HTTP/1.1 431 ") and closed
    assert requests == 0 and count == 1
    assert written.count(b"HTTP/1.1") == 1  # 431 only: no 400 or 200 after it


def test_a_head_over_the_limit_over_several_reads_gets_431() -> None:
    whole = head(70 * 1024)
    # The last read completes the head: no read alone is over the limit.
    written, closed, requests, _ = feed(whole[:40_000], whole[40_000:])
    assert written.startswith(b"HTTP/1.1 431 ") and closed and requests == 0
    reads = [whole[i : i + 1000] for i in range(0, len(whole), 1000)]
    written, closed, requests, _ = feed(*reads)
    assert written.startswith(b"HTTP/1.1 431 ") and closed and requests == 0


def test_a_head_that_never_ends_is_cut_at_the_limit() -> None:
    endless = head(200 * 1024)[:-4]  # no blank line: httptools holds the last header
    reads = [endless[i : i + 16384] for i in range(0, len(endless), 16384)]
    written, closed, requests, count = feed(*reads)
    assert written.startswith(b"HTTP/1.1 431 ") and closed and requests == 0 and count == 1


def test_heads_under_the_limit_are_served_however_they_arrive() -> None:
    single = head(MAX_HEAD_BYTES - 2048)
    written, closed, requests, count = feed(single)
    assert written.startswith(b"HTTP/1.1 200 ") and not closed
    assert requests == 1 and count == 0
    # Two requests of 40 KB in one read: the limit is per head, not per read.
    written, _, requests, count = feed(head(40 * 1024) + head(40 * 1024))
    assert written.count(b"HTTP/1.1 200 ") == 2 and requests == 2 and count == 0
    # A body is no head: 64 KiB of it in the same read as a small head.
    body = b"b" * 65536
    post = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n" + body
    written, _, requests, count = feed(post)
    assert written.startswith(b"HTTP/1.1 200 ") and requests == 1 and count == 0
