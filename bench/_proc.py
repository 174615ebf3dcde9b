"""What the benchmarks read from /proc: a process's CPU time (whole, per
thread, with its children) and its resident memory. One reader, so every
benchmark counts CPU the same way (user + system, in seconds)."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# Fields of /proc/PID/stat after the command's closing parenthesis (0-based):
# the parent's pid, then user and system time, then the reaped children's.
PPID, UTIME, STIME, CUTIME, CSTIME = 1, 11, 12, 13, 14


def stat_fields(path: Path) -> list[str]:
    """The fields of a /proc stat file after the command (which may hold spaces)."""
    return path.read_text().rsplit(")", 1)[1].split()


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, its threads included; (0, 0)
    once it has ended."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat"))
    except OSError:
        return 0.0, 0.0
    return int(fields[UTIME]) / TICK, int(fields[STIME]) / TICK


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (the main thread has the process's name)."""
    threads: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        threads[name] = threads.get(name, 0.0) + (int(fields[UTIME]) + int(fields[STIME])) / TICK
    return threads


def tree_cpu(root: int) -> float:
    """CPU seconds of ROOT, its live children and the children it reaped
    (a postmaster and its backends)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat)
        except OSError:
            continue  # ended meanwhile
        pid, ppid = int(stat.parent.name), int(fields[PPID])
        if pid == root:
            total += sum(int(f) for f in fields[UTIME : CSTIME + 1]) / TICK
        elif ppid == root:
            total += (int(fields[UTIME]) + int(fields[STIME])) / TICK
    return total


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
