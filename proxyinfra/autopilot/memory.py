"""What the autopilot keeps between rounds and processes: a small JSON file
per stack beside the stack's state (docs/architecture.md, "The autopilot's
round state in a file of its own"), and a pause file beside it.

- ``<stack>.json``: the planner's state (per group: its last scale change,
  the start of its idle spell; per proxy judged unhealthy: the start of
  that spell) and the failed updates of the last hour per
  change (the retry cap). Written atomically (a rename), only by a round
  that acted on the stack: a dry run or a paused round leaves its bytes.
- ``<stack>.paused``: present while the autopilot is paused (who and when).
  A file of its own so that `pause` never races a running round's write of
  the state: the round reads it, never writes it.

Times are aware datetimes, written as ISO 8601 in UTC.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxyinfra.autopilot.changes import GroupMemory, PlannerState
from proxyinfra.stackfile import backend_dir

VERSION = 1


class StateFileError(ValueError):
    """The state file cannot be read as this version writes it (its text names the file)."""


@dataclass(frozen=True)
class Memory:
    planner: PlannerState = field(default_factory=PlannerState)
    # Per change key ("recycle home-0", "scale home"): its failed updates, oldest first.
    failures: Mapping[str, Sequence[datetime]] = field(default_factory=dict)


def _time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise StateFileError(f"{where}: not an ISO 8601 time: {str(value)[:40]!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


@dataclass(frozen=True)
class MemoryFiles:
    """The state file of one stack and its pause file."""

    path: Path

    @property
    def pause_path(self) -> Path:
        return self.path.with_suffix(".paused")

    def load(self) -> Memory:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Memory()
        except (OSError, ValueError) as error:
            raise StateFileError(f"{self.path}: unreadable ({error})") from None
        if not isinstance(document, dict) or document.get("version") != VERSION:
            raise StateFileError(f"{self.path}: not an autopilot state file of version {VERSION}")
        groups: dict[str, GroupMemory] = {}
        for name, entry in (document.get("groups") or {}).items():
            where = f"{self.path}: groups.{name}"
            groups[str(name)] = GroupMemory(
                _time(entry.get("lastChangeAt"), where), _time(entry.get("idleSince"), where)
            )
        spells: dict[str, datetime] = {}
        for name, value in (document.get("unhealthySince") or {}).items():
            since = _time(value, f"{self.path}: unhealthySince.{name}")
            if since is not None:
                spells[str(name)] = since
        failures: dict[str, list[datetime]] = {}
        for key, times in (document.get("failures") or {}).items():
            failures[str(key)] = [
                t for t in (_time(v, f"{self.path}: failures.{key}") for v in times) if t
            ]
        return Memory(PlannerState(groups, spells), failures)

    def save(self, memory: Memory) -> None:
        document = {
            "version": VERSION,
            "groups": {
                name: {"lastChangeAt": _iso(m.last_change_at), "idleSince": _iso(m.idle_since)}
                for name, m in sorted(memory.planner.groups.items())
            },
            "unhealthySince": {
                name: _iso(since) for name, since in sorted(memory.planner.unhealthy_since.items())
            },
            "failures": {
                key: [_iso(t) for t in times]
                for key, times in sorted(memory.failures.items())
                if times
            },
        }
        _write(self.path, json.dumps(document, indent=1, sort_keys=True) + "\n")

    def paused(self) -> dict[str, Any] | None:
        """The pause file's content ({"at": ..., "by": ...}) while paused."""
        try:
            text = self.pause_path.read_text()
        except FileNotFoundError:
            return None
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        # A pause file that is not ours still pauses: stopping is the safe reading.
        return found if isinstance(found, dict) else {"at": None, "by": None}

    def pause(self, at: datetime, by: str) -> None:
        _write(self.pause_path, json.dumps({"at": _iso(at), "by": by}) + "\n")

    def resume(self) -> bool:
        """Removes the pause file; False when it was not paused."""
        try:
            self.pause_path.unlink()
        except FileNotFoundError:
            return False
        return True


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def default_path(project_dir: Path, project: str, stack: str) -> Path:
    """Beside the stack's state: ``<DIR>/autopilot/<project>/<stack>.json``
    on a file backend (``file://DIR``), where the checkpoint and its locks
    are; else ``<project dir>/.autopilot/<stack>.json``."""
    root = backend_dir(project_dir)
    if root is not None:
        return root / "autopilot" / project / f"{stack}.json"
    return project_dir / ".autopilot" / f"{stack}.json"
