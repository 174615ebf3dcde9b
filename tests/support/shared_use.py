"""A machine-wide service (the testbed, the cluster) used by several pytest
worker processes of one run (pytest-xdist, scripts/test).

Each worker's session fixture enters `shared_use`: the first user of the run
brings the service up if it is down, and the last user leaving takes it down
again, but only if this run brought it up (a developer's testbed stays). A
worker that leaves while another still uses the service leaves it running,
so no worker tears down what another is in the middle of using.

Invariant: every worker using the service holds a shared lock on
``<name>.users`` for as long as it uses it; decisions to bring the service up
or down are taken under the exclusive ``<name>.door`` lock, and `down` runs
only when an exclusive lock on ``users`` is free, that is when nobody uses it.
The run is named by pytest-xdist's run id, or by the process for a run
without workers, so a run killed half-way leaves nothing that a later run
mistakes for its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The run's locks (and its timeline, tests/support/suite_order.py); the
# suite's own tests of them point them elsewhere.
LOCKS = Path(os.environ.get("EGRESS_PROXIES_SUITE_STATE", ROOT / ".cache" / "suite"))


def run_id() -> str:
    """The same in every worker of one pytest run, different in the next."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"


@contextlib.contextmanager
def locked(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def shared_use(
    name: str,
    *,
    is_up: Callable[[], bool],
    up: Callable[[], None],
    down: Callable[[], None],
    keep: bool = False,
    locks: Path = LOCKS,
) -> Iterator[None]:
    """Within the block the service NAME is up (`up` is run by every user:
    it must be quick and harmless when the service is up already, as the
    project's scripts are). On leaving, the last user runs `down` if this run
    made the service, unless KEEP."""
    locks.mkdir(parents=True, exist_ok=True)
    door, users, made = (locks / f"{name}.{part}" for part in ("door", "users", "made-by"))
    with locked(door, fcntl.LOCK_EX):
        making = not is_up()
        if making:
            made.write_text(run_id())
        try:
            up()
        except BaseException:
            # A failed start leaves nothing behind that this run began.
            if making:
                made.unlink(missing_ok=True)
                down()
            raise
        user = os.open(users, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(user, fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(user)
        with locked(door, fcntl.LOCK_EX):
            if _nobody_uses(users) and made.exists() and made.read_text() == run_id():
                made.unlink()
                if not keep:
                    down()


def _nobody_uses(users: Path) -> bool:
    """True when no worker holds its shared lock on USERS (the caller holds the door)."""
    fd = os.open(users, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


__all__ = ["locked", "run_id", "shared_use"]
