"""Process sampling for the stack benchmarks: CPU and peak RSS of every
process under a CLI command, by kind (engine, program, provider)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from bench._proc import PPID, cpu_times, rss_bytes, stat_fields


@dataclass
class Usage:
    """CPU seconds and peak RSS (MiB) of one kind of process."""

    cpu: float = 0.0
    rss: float = 0.0


@dataclass
class Run:
    resources: int
    wall: float
    usage: dict[str, Usage] = field(default_factory=dict)

    @property
    def cpu(self) -> float:
        return sum(u.cpu for u in self.usage.values())


def kind(pid: int) -> str:
    """engine, program or provider (what each process of a stack operation is)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    if comm == "pulumi":
        return "engine"
    if "dynamic_host" in cmdline or "pulumi.dynamic" in cmdline:
        return "provider"
    if "language-python" in cmdline or "__main__" in cmdline or "_exec" in cmdline:
        return "program"
    return "other"


class Sampler:
    """Polls /proc for the process tree under `root`: each process's last CPU
    time and peak RSS (a process that ends between two looks loses at most
    the last interval's CPU)."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root = root
        self.seen: dict[int, tuple[str, float, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int(stat_fields(entry / "stat")[PPID])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        return tree

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            for pid in self._tree():
                try:
                    cpu = sum(cpu_times(pid))
                    rss = rss_bytes(pid) / 2**20
                except (OSError, IndexError, ValueError):
                    continue
                name, old_cpu, old_rss = self.seen.get(pid, (kind(pid), 0.0, 0.0))
                self.seen[pid] = (name, max(old_cpu, cpu), max(old_rss, rss))
            self._stop.wait(interval)

    def stop(self) -> dict[str, Usage]:
        self._stop.set()
        self._thread.join()
        usage: dict[str, Usage] = {}
        for name, cpu, rss in self.seen.values():
            total = usage.setdefault(name, Usage())
            total.cpu += cpu
            total.rss = max(total.rss, rss)
        return usage
