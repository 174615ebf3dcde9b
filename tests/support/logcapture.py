"""Every log record of a block, from every logger at every level, to check
what boot data (user-data, vendor-data, password hashes) never reaches a log.

The project's own configuration (proxyinfra.logs.configure) stops its
loggers from propagating and may set them above TRACE; these helpers hang a
handler on every logger and open every level while they run, so a line that
some configuration would filter out counts too. Each record is kept as the
text a handler would write, with its arguments and extra fields.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Iterator

# Below TRACE (5), the most verbose level EGRESS_PROXIES_LOG selects.
EVERY_LEVEL = 1
# A program run under tests.harness.run_program writes its records here.
ENV_LOG_FILE = "EGRESS_PROXIES_TEST_EVERY_RECORD"

_FORMAT = logging.Formatter("%(levelname)s %(name)s %(message)s")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def record_text(record: logging.LogRecord) -> str:
    """The formatted line (with any traceback) and every extra field."""
    extras = [f"{key}={value}" for key, value in vars(record).items() if key not in _STANDARD]
    return "\n".join([_FORMAT.format(record), *extras])


class _Every(logging.Handler):
    def __init__(self, keep: Callable[[str], None]) -> None:
        super().__init__(EVERY_LEVEL)
        self.keep = keep
        self._seen: weakref.WeakSet[logging.LogRecord] = weakref.WeakSet()

    def emit(self, record: logging.LogRecord) -> None:
        # Hung on every logger, it meets a propagating record more than once.
        if record not in self._seen:
            self._seen.add(record)
            self.keep(record_text(record))


def _loggers() -> list[logging.Logger]:
    known = logging.root.manager.loggerDict.values()
    return [logging.root, *(x for x in known if isinstance(x, logging.Logger))]


@contextlib.contextmanager
def every_record() -> Iterator[list[str]]:
    """The texts of the records logged inside the block; levels, handlers and
    propagation of every logger are as before afterwards."""
    texts: list[str] = []
    handler = _Every(texts.append)
    disabled = logging.root.manager.disable
    before = {id(x): (x.level, x.propagate, list(x.handlers)) for x in _loggers()}
    logging.disable(logging.NOTSET)
    for logger in _loggers():
        logger.setLevel(EVERY_LEVEL)
        logger.addHandler(handler)
    try:
        yield texts
    finally:
        logging.disable(disabled)
        for logger in _loggers():
            # Loggers made inside the block go back to a fresh logger's state.
            level, propagate, handlers = before.get(id(logger), (logging.NOTSET, True, []))
            logger.setLevel(level)
            logger.propagate = propagate
            logger.handlers[:] = handlers


def capture_to_file(path: str) -> None:
    """For a whole process (a program under mocks): every record from here on
    is appended to `path`, whatever configures logging later."""

    def keep(text: str) -> None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(text + "\n")

    handler = _Every(keep)
    logging.disable(logging.NOTSET)
    for logger in _loggers():
        logger.setLevel(EVERY_LEVEL)
        logger.addHandler(handler)
    # Loggers made later inherit the open level from the root and propagate to it.


def leaks(texts: Iterable[str], secrets: Iterable[str]) -> list[str]:
    """The secrets that occur in any of `texts` (empty: none)."""
    joined = "\n".join(texts)
    return sorted({secret for secret in secrets if secret and secret in joined})


def telling_lines(document: str) -> list[str]:
    """The lines of a boot document that would give it away in a log: all
    but blank ones, comments and bare structure (`#cloud-config`, `runcmd:`,
    `- |`, `set -eu`)."""
    lines = []
    for line in document.splitlines():
        text = line.strip()
        if len(text) < 12 or text.startswith("#") or text.endswith(":"):
            continue
        lines.append(text)
    return lines


def program_main() -> object:
    """proxyinfra.program:main with every record captured to the file that
    ENV_LOG_FILE names (a target for tests.harness.program.run_program)."""
    capture_to_file(os.environ[ENV_LOG_FILE])
    from proxyinfra.program import main

    return main()
