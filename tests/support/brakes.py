"""What the brake's unit tests share (discovery/brake.py): a monotonic clock
the test turns, wrong tokens by the dozen, and the fields of the auth log's
warnings whatever the loggers' configuration."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from discovery.brake import Brake


class Clock:
    """Monotonic seconds that move only when the test sets `now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(brake: Brake, address: str, times: int) -> list[int]:
    """`times` wrong bearer tokens from `address`; the closures they caused."""
    return [brake.failed(address, "bearer") for _ in range(times)]


class Kept(logging.Handler):
    """The fields of `discovery.auth` warnings whose message is `message`."""

    def __init__(self, message: str) -> None:
        super().__init__(logging.WARNING)
        self.message = message
        self.fields: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.message:
            self.fields.append(record.discovery_fields)  # type: ignore[attr-defined]


@contextlib.contextmanager
def warnings_kept(message: str) -> Iterator[Kept]:
    logger = logging.getLogger("discovery.auth")
    kept, level = Kept(message), logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)
    try:
        yield kept
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
