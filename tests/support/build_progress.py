"""The background builds' progress, written into the suite's own output.

On a new machine scripts/test leaves the Go builds and images running in the
background, and the tests that need them wait in a worker (tests/conftest.py's
gates). pytest-xdist shows nothing a worker writes, so the run printed
nothing for its last quarter hour while the pulumi-kubernetes plugin built.
The controller watches the builds' logs instead and writes each new step as
it comes.

The first minute is left out: a cached build writes its few lines in the
first seconds, and a warm run should print none of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.support.programs import ROOT

# The logs scripts/test points the background builds' stderr at.
LOGS = tuple(
    ROOT / ".cache" / name
    for name in ("build-pulumi.log", "build-proxy-image.log", "build-kubernetes.log")
)
QUIET_S = 60.0  # nothing is written before this (cached builds are done by then)
POLL_S = 5.0


def last_line(path: Path) -> str | None:
    """The last non-empty line of PATH (None when it has none, or is not there)."""
    try:
        with path.open("rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - 4096))
            tail = log.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else None


class BuildProgress:
    """Each `poll` writes the last line of every log that has a new one,
    from QUIET seconds after it was made; what the logs said by then is the
    baseline, not news."""

    def __init__(
        self,
        logs: Iterable[Path],
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        quiet: float = QUIET_S,
    ) -> None:
        self._logs = tuple(logs)
        self._write = write
        self._clock = clock
        self._from = clock() + quiet
        self._said: dict[Path, str | None] | None = None  # None: the baseline is not taken

    def poll(self) -> None:
        if self._clock() < self._from:
            return
        now = {log: last_line(log) for log in self._logs}
        if self._said is None:
            self._said = now
            return
        for log, line in now.items():
            if line is not None and line != self._said[log]:
                self._write(f"background build: {line}")
        self._said = now


class Watcher:
    """`BuildProgress.poll` every POLL_S seconds in a daemon thread, until `stop`."""

    def __init__(self, progress: BuildProgress, every: float = POLL_S) -> None:
        self._progress = progress
        self._every = every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="build-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            self._progress.poll()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
