"""prefetched(): a base image's download read ahead of its upload."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from providers.kvm.download import prefetched


def test_the_chunks_come_through_in_order() -> None:
    assert list(prefetched(iter([b"a", b"b", b"c"]), depth=2)) == [b"a", b"b", b"c"]


def test_the_reader_runs_ahead_by_at_most_depth_chunks() -> None:
    read: list[int] = []

    def source() -> Iterator[bytes]:
        for i in range(10):
            read.append(i)
            yield bytes([i])

    chunks = prefetched(source(), depth=3)
    assert next(chunks) == b"\x00"
    time.sleep(0.2)  # the reader fills what it may, then waits
    assert len(read) <= 1 + 3 + 1  # the one taken, a full queue, one in its hand
    assert list(chunks) == [bytes([i]) for i in range(1, 10)]


def test_a_reader_error_is_raised_where_the_next_chunk_is_asked_for() -> None:
    def source() -> Iterator[bytes]:
        yield b"a"
        raise OSError("connection reset by the mirror")

    chunks = prefetched(source())
    assert next(chunks) == b"a"
    with pytest.raises(OSError, match="connection reset"):
        next(chunks)


def test_leaving_early_stops_the_reader() -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"x" * 1024

    before = set(threading.enumerate())
    chunks = prefetched(endless(), depth=2)
    next(chunks)
    # This reader, whatever other threads come and go meanwhile.
    (reader,) = [t for t in set(threading.enumerate()) - before if t.name == "base-image-download"]
    assert reader.is_alive()
    chunks.close()  # the upload failed: the generator is closed
    reader.join(timeout=2)
    assert not reader.is_alive()
