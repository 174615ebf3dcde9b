"""`--log FILE` under log rotation: the long-running autopilot never holds
the file open, so a log that logrotate renamed (its `create` mode) gets no
more lines, and the next line starts the new file; every line whole."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from proxyinfra.autopilot.log import DecisionLog, LogFile

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_rotated_log_is_followed_by_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "autopilot.log"
    log = DecisionLog("prod", lambda: NOW, LogFile(path))
    assert path.read_text() == ""  # made (and checked writable) before any line
    log.write("round", result="planned", changes=1)
    path.rename(path.with_suffix(".log.1"))  # logrotate: rename, then create
    path.write_text("")
    log.write("round", result="planned", changes=2)
    assert [line["changes"] for line in _lines(path.with_suffix(".log.1"))] == [1]
    assert [line["changes"] for line in _lines(path)] == [2]


def test_lines_are_appended_to_what_the_file_held(tmp_path: Path) -> None:
    path = tmp_path / "autopilot.log"
    path.write_text('{"event": "earlier"}\n')
    DecisionLog("prod", lambda: NOW, LogFile(path)).write("round", result="paused")
    assert [line["event"] for line in _lines(path)] == ["earlier", "round"]


def test_a_log_directory_removed_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "autopilot.log"
    log = DecisionLog("prod", lambda: NOW, LogFile(path))
    path.unlink()
    path.parent.rmdir()  # a cleanup of old logs took the directory
    log.write("round", result="planned")
    assert [line["result"] for line in _lines(path)] == ["planned"]
