"""The decision log: one JSON object per line, on stdout or appended to
``--log FILE`` (docs/autopilot.md, "The decision log").

Every line has ``ts`` (the round's clock, ISO 8601 UTC), ``stack`` and
``event``; a change's lines add ``kind``, ``rule``, ``group``, ``proxies``,
``signal``, ``message``, ``result`` and, once it ran, ``update`` (its number
in `pulumi stack history`) and ``duration`` (seconds). Text that came from
outside (a change's reason, an engine error) goes through ``one_line``: no
line break, no control character, bounded. Nothing secret is ever given to
it: names, counts, times and the engine's error text only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from proxyinfra.autopilot.changes import one_line


class Sink(Protocol):
    """Where the lines go: stdout, a test's buffer, or a ``LogFile``."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class LogFile:
    """``--log FILE``: each line appended by opening the file for it. A log
    rotated away (logrotate's ``create``: the file renamed, a new one made)
    gets the next line in the new file, with no signal to reopen; one write
    in append mode puts a whole line at the end. Lines come a few a round,
    so an open per line costs nothing that shows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass  # writable now, or the command says so before anything runs

    def write(self, text: str, /) -> int:
        # Its directory made again if it went (a cleanup of old logs): a line
        # that cannot be written would fail the round that writes it.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            return out.write(text)

    def flush(self) -> None:
        pass  # each write closed its file


class DecisionLog:
    def __init__(self, stack: str, now: Callable[[], datetime], out: Sink | None = None) -> None:
        self.stack = stack
        self._now = now
        self._out = out if out is not None else sys.stdout
        self.lines = 0

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        line: dict[str, Any] = {
            "ts": self._now().astimezone(UTC).isoformat(),
            "stack": self.stack,
            "event": event,
        }
        for key, value in fields.items():
            if value is None:
                continue
            line[key] = one_line(value) if key in ("message", "error", "reason") else value
        self._out.write(json.dumps(line, default=str) + "\n")
        self._out.flush()
        self.lines += 1
        return line
