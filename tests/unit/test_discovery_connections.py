"""The pure parts of discovery/connections.py and discovery/backpressure.py:
the connection cap, the raised descriptor limit, the log filter for handlers
cancelled at a stop, and, on the protocol with a transport of the test's,
the head size limit read by read, the bound on pipelined requests and the
write timeout (the connections over sockets:
tests/integration/test_discovery_connections.py and test_discovery_pipelining.py)."""

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

from discovery.backpressure import MAX_PIPELINED
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
        self.aborted = False
        self.reading = True
        self.unsent = 0  # bytes the test says the client has not read

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


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


# -- pipelined requests and unread answers (discovery/backpressure.py) -------------------------


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


class Pipelined:
    """One connection of the protocol, on the running loop, to an app that answers
    each request with its path once `go` is set."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.go = asyncio.Event()
        self.started: list[str] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            self.started.append(scope["path"])
            await self.go.wait()
            body = scope["path"].encode()
            headers = [(b"content-length", b"%d" % len(body))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        self.protocol = protocol_class(guard)(config, ServerState(), {}, asyncio.get_running_loop())
        self.transport = Transport()
        self.protocol.connection_made(self.transport)

    def waiting(self) -> int:
        """Requests parsed and not yet started (uvicorn's queue)."""
        return len(self.protocol.pipeline)

    def answered(self) -> list[bytes]:
        return [
            part.rsplit(b"\r\n\r\n", 1)[-1]
            for part in self.transport.written.split(b"HTTP/1.1 ")[1:]
        ]


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_pipelined_requests_wait_at_most_max_pipelined_and_reading_pauses() -> None:
    paths = [f"/r{i}" for i in range(1000)]

    async def run() -> None:
        conn = Pipelined(ConnectionGuard(max_connections=10, registry=CollectorRegistry()))
        conn.protocol.data_received(b"".join(get(p) for p in paths))  # one read, 1,000 requests
        await turns()
        # One being answered, MAX_PIPELINED waiting, the rest of the read held.
        assert conn.started == ["/r0"] and conn.waiting() == MAX_PIPELINED
        assert not conn.transport.reading and conn.protocol in conn.guard.queued
        conn.protocol.flow.resume_reading()  # what uvicorn calls on every answer and body read
        assert not conn.transport.reading
        conn.go.set()
        most = 0
        for _ in range(20 * len(paths)):
            await asyncio.sleep(0)
            most = max(most, conn.waiting())
            if len(conn.answered()) == len(paths):
                break
        assert conn.answered() == [p.encode() for p in paths]  # each once, in order
        assert most <= MAX_PIPELINED and conn.transport.reading  # read on once all was fed
        assert conn.guard.queued == {}
        conn.protocol.connection_lost(None)

    asyncio.run(run())


def test_a_head_split_across_reads_is_served_when_the_queue_was_full() -> None:
    """The held rest of a read ends in half a head; the next read completes it."""
    whole = b"".join(get(f"/r{i}") for i in range(40))

    async def run() -> None:
        conn = Pipelined(ConnectionGuard(max_connections=10, registry=CollectorRegistry()))
        conn.protocol.data_received(whole[:-7])
        conn.protocol.data_received(whole[-7:])  # arrived before the pause took effect
        conn.go.set()
        for _ in range(2000):
            await asyncio.sleep(0)
        assert conn.answered() == [f"/r{i}".encode() for i in range(40)]
        conn.protocol.connection_lost(None)

    asyncio.run(run())


def test_answers_left_unread_past_the_write_timeout_close_the_connection() -> None:
    """The timer starts when the transport's buffer passes its high-water mark
    (pause_writing) and stops when it drains (resume_writing); a write timeout
    of 0 fires at the loop's next turn."""

    async def run() -> None:
        guard = ConnectionGuard(max_connections=10, registry=CollectorRegistry(), write_timeout=0)
        drained, stuck = Pipelined(guard), Pipelined(guard)
        for conn in (drained, stuck):
            conn.transport.unsent = 100_000
            conn.protocol.pause_writing()
        assert set(guard.stalled) == {drained.protocol, stuck.protocol}
        drained.transport.unsent = 0
        drained.protocol.resume_writing()
        await turns()
        assert stuck.transport.aborted and not drained.transport.closed
        assert guard.stalled == {}
        assert closed_count(guard, "write_timeout") == 1

    asyncio.run(run())


def test_a_client_that_reads_slowly_gets_another_period_each_time_it_reads() -> None:
    async def run() -> None:
        guard = ConnectionGuard(max_connections=10, registry=CollectorRegistry(), write_timeout=0)
        conn = Pipelined(guard)
        conn.transport.unsent = 3_000_000  # a large answer, buffered at once
        conn.protocol.pause_writing()
        for unsent in (2_000_000, 1_000_000, 500_000):
            conn.transport.unsent = unsent  # the client read some during the period
            await asyncio.sleep(0)
            assert not conn.transport.closed and guard.stalled
        await turns()  # a whole period without a byte read
        assert conn.transport.aborted and closed_count(guard, "write_timeout") == 1

    asyncio.run(run())


def test_a_close_with_answers_unsent_is_aborted_after_the_write_timeout() -> None:
    """A close waits for the unsent answers to be flushed: a client that never
    reads them would hold the connection for ever."""

    async def run() -> None:
        guard = ConnectionGuard(max_connections=10, registry=CollectorRegistry(), write_timeout=0)
        conn = Pipelined(guard)
        conn.transport.unsent = 1000  # under the high-water mark: no pause_writing
        conn.protocol.timeout_keep_alive_handler()  # uvicorn's keep-alive timeout closes it
        assert conn.transport.closed and not conn.transport.aborted
        await turns()
        assert conn.transport.aborted and closed_count(guard, "write_timeout") == 1

    asyncio.run(run())


def test_at_the_cap_idle_connections_make_room_then_unread_ones_then_pipelining_ones() -> None:
    guard = ConnectionGuard(max_connections=2, registry=CollectorRegistry())
    idle, answered, stalled, queued = Transport(), Transport(), Transport(), Transport()
    answered.unsent = 1000  # waits for its next request, its last answer unread
    guard.waiting.update({object(): idle, object(): answered})
    pipelining_and_stalled = object()
    guard.stalled[pipelining_and_stalled] = stalled
    guard.queued.update({pipelining_and_stalled: stalled, object(): queued})
    assert guard.make_room() and idle.closed and not idle.aborted and not stalled.closed
    # A close would wait for the unread answers to be flushed: never.
    assert guard.make_room() and answered.aborted and not stalled.closed
    assert guard.make_room() and stalled.aborted and not queued.closed
    assert guard.make_room() and queued.aborted  # not the one already reset
    assert not guard.make_room()  # every connection busy with one request: refused
    assert closed_count(guard, "evicted") == 4
    assert guard.registry.get_sample_value("discovery_connections_refused_total") == 1


def closed_count(guard: ConnectionGuard, reason: str) -> float | None:
    return guard.registry.get_sample_value("discovery_connections_closed_total", {"reason": reason})
