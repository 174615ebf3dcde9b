"""The socket directories of a provider process killed by the engine are
removed by the next one (providers/kvm/rundir.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.kvm.rundir import private_dir

PREFIX = "egress-libvirt-"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_new_directory_sweeps_only_those_of_dead_processes(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}{_dead_pid()}-abc"
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    unnamed = tmp_path / f"{PREFIX}xyz"  # not named for a process: never guessed at
    other = tmp_path / f"egress-ssh-{_dead_pid()}-ghi"  # another prefix
    for directory in (dead, live, unnamed, other):
        directory.mkdir()
        (directory / "libvirt.sock").touch()

    made = Path(private_dir(PREFIX, parent=str(tmp_path)))

    assert not dead.exists()
    assert live.exists() and unnamed.exists() and other.exists()
    assert made.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a unix socket's path holds 107 bytes,
    less than pytest's temporary directories leave."""
    with tempfile.TemporaryDirectory(prefix="rundir-", dir="/tmp") as where:
        yield Path(where)


def test_the_bridge_of_a_killed_provider_is_swept_by_the_next(short_dir: Path) -> None:
    tmp_path = short_dir
    code = (
        "import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
        "from providers.kvm.bridge import SocketBridge\n"
        "bridge = SocketBridge(lambda: None, 'test')\n"
        "print(bridge.path, flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    left = Path(child.stdout.readline().strip()).parent
    child.send_signal(signal.SIGKILL)  # as the engine ends a provider: nothing closes
    child.wait()
    assert left.exists()

    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        from providers.kvm.bridge import SocketBridge

        bridge = SocketBridge(lambda: None, "next")
        try:
            assert not left.exists()
            assert Path(bridge.path).parent.exists()
        finally:
            bridge.close()
    finally:
        tempfile.tempdir = saved
    assert not Path(bridge.path).parent.exists()


def test_sockets_go_to_tmp_when_the_temporary_directory_leaves_them_no_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deep $TMPDIR (the CLI's in a test stack, 56 characters and more,
    measured: "AF_UNIX path too long" from every kvm create)."""
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    made = Path(private_dir(PREFIX))
    try:
        assert made.parent == Path("/tmp")
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(made / "libvirt.sock"))
    finally:
        made.joinpath("libvirt.sock").unlink(missing_ok=True)
        made.rmdir()
    # Too long in the deep one, it is why: the same bind there fails.
    with socket.socket(socket.AF_UNIX) as server, pytest.raises(OSError, match="too long"):
        server.bind(str(deep / f"{PREFIX}{os.getpid()}-abcdefgh" / "libvirt.sock"))


def test_sockets_stay_in_a_temporary_directory_that_leaves_them_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = Path(tempfile.mkdtemp(prefix="s-", dir="/tmp"))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(short))
        made = Path(private_dir(PREFIX))
        assert made.parent == short
    finally:
        shutil.rmtree(short)
