"""A stack lock whose holder is dead (proxyinfra/autopilot/locks.py): a lock
file of this host naming a pid that does not run, or runs something other
than pulumi, is named stale with the operator's remedy at once; a live
pulumi, another host's lock or an unreadable one is not judged. The lock is
never removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from proxyinfra.autopilot.locks import (
    StaleHolder,
    lock_holder,
    process_name,
    read_lock,
    remedy_for,
)
from proxyinfra.autopilot.status import Status
from tests.support.autopilot_round import RECYCLE, World, answer

PROJECT = "egress-proxies"
HOST = "buildhost"


def write_lock(backend: Path, pid: int, host: str = HOST, stack: str = "lab", n: int = 0) -> Path:
    """A lock file as the file backend writes it."""
    where = backend / ".pulumi" / "locks" / "organization" / PROJECT / stack
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"9b1c2d3e-000{n}.json"
    path.write_text(
        json.dumps(
            {"pid": pid, "username": "ops", "hostname": host, "timestamp": "2026-12-04T23:00:00Z"}
        )
    )
    return path


def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def names(table: dict[int, str | None]):  # type: ignore[no-untyped-def]
    return lambda pid: table.get(pid)


def test_a_dead_pid_on_this_host_is_a_stale_lock_with_its_remedy(tmp_path: Path) -> None:
    lock = write_lock(tmp_path, 4242)
    holder = lock_holder(tmp_path, PROJECT, "lab", this_host=HOST, name_of=names({}))
    assert isinstance(holder, StaleHolder) and isinstance(holder, str)
    assert holder.remedy == remedy_for("lab") == "pulumi cancel --stack lab --yes"
    assert holder.startswith("ops@buildhost (pid 4242) since 2026-12-04T23:00:00Z: a stale lock")
    assert "pid 4242 is not running on this host" in holder
    assert "`pulumi cancel --stack lab --yes`" in holder
    assert lock.exists()  # never removed


def test_a_pid_that_runs_something_else_is_stale(tmp_path: Path) -> None:
    write_lock(tmp_path, 4242)
    holder = lock_holder(tmp_path, PROJECT, "lab", this_host=HOST, name_of=names({4242: "sshd"}))
    assert isinstance(holder, StaleHolder)
    assert "pid 4242 on this host runs sshd, not pulumi" in holder


def test_a_running_pulumi_another_host_or_an_unknown_process_is_waited_for(
    tmp_path: Path,
) -> None:
    write_lock(tmp_path, 4242)
    alive = lock_holder(tmp_path, PROJECT, "lab", this_host=HOST, name_of=names({4242: "pulumi"}))
    assert alive == "ops@buildhost (pid 4242) since 2026-12-04T23:00:00Z"
    assert not isinstance(alive, StaleHolder)
    # Not ours to read: running, name unknown.
    unknown = lock_holder(tmp_path, PROJECT, "lab", this_host=HOST, name_of=names({4242: "?"}))
    assert not isinstance(unknown, StaleHolder)
    # Another host's pid means nothing here.
    elsewhere = lock_holder(tmp_path, PROJECT, "lab", this_host="laptop", name_of=names({}))
    assert elsewhere == alive and not isinstance(elsewhere, StaleHolder)


def test_any_live_lock_means_the_stack_is_busy(tmp_path: Path) -> None:
    write_lock(tmp_path, 4242, n=0)
    write_lock(tmp_path, 5151, n=1)
    holder = lock_holder(tmp_path, PROJECT, "lab", this_host=HOST, name_of=names({5151: "pulumi"}))
    assert holder == "ops@buildhost (pid 5151) since 2026-12-04T23:00:00Z"


def test_a_lock_being_written_is_someone_unnamed_and_none_is_free(tmp_path: Path) -> None:
    assert lock_holder(tmp_path, PROJECT, "lab", this_host=HOST) is None
    write_lock(tmp_path, 4242, stack="other")
    assert lock_holder(tmp_path, PROJECT, "lab", this_host=HOST) is None
    write_lock(tmp_path, 4242).write_text('{"pid": 42')
    assert lock_holder(tmp_path, PROJECT, "lab", this_host=HOST) == ""


def test_odd_pids_are_never_judged(tmp_path: Path) -> None:
    for pid in (True, 0, -1, "4242"):
        path = write_lock(tmp_path, 1)
        content = json.loads(path.read_text())
        path.write_text(json.dumps({**content, "pid": pid}))
        lock = read_lock(path)
        assert lock is not None and lock.pid is None
        holder = lock_holder(tmp_path, PROJECT, "lab", this_host=HOST, name_of=names({}))
        assert not isinstance(holder, StaleHolder)


def test_the_real_process_table(tmp_path: Path) -> None:
    """/proc as it is: a reaped child is gone, this process is python, a
    child that ended and is not reaped yet (a zombie) is not running."""
    assert process_name(dead_pid()) is None
    assert process_name(os.getpid()) not in (None, "pulumi")
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            os.sched_yield()
        assert process_name(zombie.pid) is None
    finally:
        zombie.wait()
    write_lock(tmp_path, dead_pid(), host="this-host")
    assert isinstance(lock_holder(tmp_path, PROJECT, "lab", this_host="this-host"), StaleHolder)


def test_a_killed_holder_leaves_a_stale_lock(tmp_path: Path) -> None:
    """The holder killed as a crash ends it: its lock stays, named stale."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    write_lock(tmp_path, holder.pid, host="this-host")
    alive = lock_holder(tmp_path, PROJECT, "lab", this_host="this-host")
    assert isinstance(alive, StaleHolder)  # python, not pulumi
    assert ", not pulumi" in alive
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    gone = lock_holder(tmp_path, PROJECT, "lab", this_host="this-host")
    assert isinstance(gone, StaleHolder) and "is not running on this host" in gone


class ShownStatus(Status):
    """The status, with every ``waitingFor`` it was given."""

    def __init__(self, stack: str) -> None:
        super().__init__(stack)
        self.waiting_for: list[object] = []

    def set(self, **fields: Any) -> None:
        if "waitingFor" in fields:
            self.waiting_for.append(fields["waitingFor"])
        super().set(**fields)


def test_the_round_says_at_once_that_the_lock_is_stale_and_names_the_remedy(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    stale = StaleHolder(
        "ops@buildhost (pid 4242) since 2026-12-04T23:00:00Z: a stale lock (pid 4242 is not "
        "running on this host), left by a killed run; the autopilot never removes another's "
        "lock: check that no update runs, then `pulumi cancel --stack sim --yes`",
        "pulumi cancel --stack sim --yes",
    )
    world.stack.lock_holder = lambda: stale  # type: ignore[method-assign]
    world.status = ShownStatus("sim")
    world.pilot(lock_timeout=60).round()
    # The first look says it: the wait line and the status name the stale lock and its remedy.
    [wait] = world.lines("wait")
    assert wait["holder"] == stale and "pulumi cancel --stack sim --yes" in wait["holder"]
    assert stale in world.status.waiting_for
    # Never removed, never cancelled: no edit, no update.
    assert world.stack.edits == [] and world.stack.updates == []


def test_the_round_gives_a_stale_lock_s_change_up_at_once(tmp_path: Path) -> None:
    """A dead holder never frees its lock: no wait (no sleep at all) for the
    hour of --lock-timeout; nothing edited, nothing updated; the status keeps
    naming the lock after the round."""
    world = World(tmp_path, RECYCLE, {"home": 2})
    world.clock.advance(timedelta(hours=1))
    world.signals.answer = answer(world.clock, world.names(), blocked={"home-0": 3})
    stale = StaleHolder(
        "ops@buildhost (pid 4242) since T: a stale lock (...)", "pulumi cancel --stack sim --yes"
    )
    world.stack.lock_holder = lambda: stale  # type: ignore[method-assign]
    world.pilot(lock_timeout=3600).round()
    assert world.clock.slept == []
    [change] = world.lines("change")
    assert change["result"] == "stale-lock" and change["error"] == stale
    [wait] = world.lines("wait")
    assert "given up" in wait["reason"]
    assert world.status.document()["waitingFor"] == stale
    assert world.stack.edits == [] and world.stack.updates == []
