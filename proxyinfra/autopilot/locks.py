"""Who holds a stack's lock on a file (DIY) backend, and whether that holder
is dead: a lock left by a killed `pulumi up` never frees itself.

The backend writes one JSON file per lock under
``<DIR>/.pulumi/locks/<org>/<project>/<stack>/``, naming its ``username``,
``hostname``, ``pid`` and ``timestamp``. A lock is *stale* when its host is
this host (pulumi writes ``os.Hostname()``, the same name
``socket.gethostname()`` gives) and its pid is not running here, or runs a
program that is not ``pulumi`` (the pid came back for something else).
A lock of another host is never judged: its pid means nothing here.

Staleness changes nothing about the rule that the autopilot never removes
another's lock nor cancels an update: it only says so at once, with the
operator's remedy (``pulumi cancel --stack NAME --yes``, which on a file
backend deletes the stack's lock files; tested in
tests/engine/test_cli_autopilot_stale_lock.py), instead of waiting
``--lock-timeout`` for a holder that is gone.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxyinfra.autopilot.changes import one_line

# The program name of a pid on this host; None when no such process runs.
ProcessName = Callable[[int], str | None]
PULUMI = "pulumi"  # what the CLI, the lock's holder, is called


class StaleHolder(str):
    """A lock holder that is dead: the text (what the ``wait`` line and the
    status's ``waitingFor`` show) says so and names ``remedy``, the
    operator's command. A ``str``, so that the seam's ``lock_holder``
    answer keeps its type for every caller."""

    remedy: str

    def __new__(cls, text: str, remedy: str) -> StaleHolder:
        made = super().__new__(cls, text)
        made.remedy = remedy
        return made


@dataclass(frozen=True)
class LockFile:
    username: str
    hostname: str
    pid: int | None
    timestamp: str

    def holder(self) -> str:
        """user@host (pid N) since T, one printable line."""
        return one_line(f"{self.username}@{self.hostname} (pid {self.pid}) since {self.timestamp}")


def read_lock(path: Path) -> LockFile | None:
    """The lock file's fields; None when it cannot be read as one (being
    written, or gone)."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict):
        return None
    pid = content.get("pid")
    return LockFile(
        username=str(content.get("username")),
        hostname=str(content.get("hostname")),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
        timestamp=str(content.get("timestamp")),
    )


def process_name(pid: int) -> str | None:
    """The program pid PID runs on this host (the base name of its argv[0],
    else its comm), None when no process has that pid or it is a zombie
    (dead, not yet reaped). A process this user may not read is running,
    name unknown: ``"?"``."""
    proc = Path("/proc") / str(pid)
    try:
        # The state is the field after the command's parenthesised name.
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        name = os.path.basename(argv0) or (proc / "comm").read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        return "?"
    return None if state == "Z" else name


def stale_because(lock: LockFile, this_host: str, name_of: ProcessName) -> str | None:
    """Why LOCK's holder is dead, or None when it may be alive (another host,
    no pid, a running pulumi, or a process that cannot be read)."""
    if lock.hostname != this_host or lock.pid is None:
        return None
    name = name_of(lock.pid)
    if name is None:
        return f"pid {lock.pid} is not running on this host"
    if name not in (PULUMI, "?"):
        return f"pid {lock.pid} on this host runs {one_line(name[:40])}, not {PULUMI}"
    return None


def remedy_for(stack: str) -> str:
    return f"pulumi cancel --stack {stack} --yes"


def lock_holder(
    backend: Path,
    project: str,
    stack: str,
    *,
    this_host: str | None = None,
    name_of: ProcessName = process_name,
) -> str | None:
    """The holder of STACK's lock in the file backend at BACKEND: None when
    free, '' when a lock file cannot be read (someone unnamed holds it), a
    StaleHolder when its holder is dead (each lock file looked at: any live
    one means the stack is really busy), else its user@host, pid and time."""
    locks = sorted((backend / ".pulumi" / "locks").glob(f"**/{project}/{stack}/*.json"))
    if not locks:
        return None
    host = this_host if this_host is not None else socket.gethostname()
    dead: list[tuple[LockFile, str]] = []
    for path in locks:
        lock = read_lock(path)
        if lock is None:
            return ""
        why = stale_because(lock, host, name_of)
        if why is None:
            return lock.holder()
        dead.append((lock, why))
    lock, why = dead[0]
    remedy = remedy_for(stack)
    return StaleHolder(
        f"{lock.holder()}: a stale lock ({why}), left by a killed run; the autopilot never "
        f"removes another's lock: check that no update runs, then `{remedy}`",
        remedy,
    )
