"""scripts/lib/common.sh, what the project's bash scripts share, run by bash
as they run it: a step stops at its first failing command (errexit kept inside
the step's function) and the failure names the step, its subject and that
command; exit hooks run however the script ends; a build directory goes at
exit with what is mounted below it, and the ones a killed build left go when
the next one starts."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.programs import ROOT

pytestmark = pytest.mark.integration

COMMON = ROOT / "scripts" / "lib" / "common.sh"


def bash(script: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """SCRIPT after `set -euo pipefail` and common.sh, as the project's scripts
    start; $1 is TMP."""
    prologue = f'set -euo pipefail\nNAME=demo\n. "{COMMON}"\n'
    return subprocess.run(
        ["bash", "-c", prologue + script, "demo", str(tmp)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_step_stops_at_its_first_failing_command_and_names_it(tmp_path: Path) -> None:
    done = bash(
        """
        STEP_LOG=$1/step.log
        first() { echo "first's output"; }
        second() {
          echo "second's output"
          grep -q needle /dev/null
          touch "$1/after"
        }
        run_step 1/2 "the first" first
        run_step --for "module m@v1" 2/2 "the second" second "$1"
        echo unreachable
        """,
        tmp_path,
    )
    assert done.returncode == 1
    assert "demo: [1/2] the first\n" in done.stderr
    assert "demo: [1/2] done in " in done.stderr
    assert "demo: [2/2] the second (module m@v1)\n" in done.stderr
    assert "second's output\n" in done.stderr  # the step log's tail, on the script's stderr
    assert (
        "demo: error: step [2/2] 'the second' failed for module m@v1 (exit status 1)"
        " at: grep -q needle /dev/null\n"
    ) in done.stderr
    # Nothing after the failing command ran, in the step or after it.
    assert not (tmp_path / "after").exists()
    assert done.stdout == ""
    assert "first's output" not in done.stderr  # each step's log is its own


def test_a_failing_step_command_is_named_with_its_words(tmp_path: Path) -> None:
    done = bash(
        """
        STEP_LOG=$1/step.log
        run_step 1/1 "copying" cp "$1/no such file" "$1/copy"
        """,
        tmp_path,
    )
    assert done.returncode == 1
    assert f"at: cp {tmp_path}/no such file {tmp_path}/copy\n" in done.stderr, done.stderr
    assert "No such file or directory" in done.stderr


def test_exit_hooks_run_last_first_and_the_exit_status_stays(tmp_path: Path) -> None:
    # What bash lists before any sourcing: the signals its parent ignores
    # (SIGHUP under nohup) show as traps of their own.
    inherited = subprocess.run(["bash", "-c", "trap -p"], capture_output=True, text=True)
    (tmp_path / "inherited").write_text(inherited.stdout)
    done = bash(
        """
        [[ $(trap -p) == "$(<"$1/inherited")" ]] || { echo "sourcing set a trap"; exit 9; }
        at_exit echo "the first hook"
        at_exit false
        at_exit echo "the last hook"
        exit 7
        """,
        tmp_path,
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "the last hook\nthe first hook\n"


def test_a_private_tmpdir_holds_what_children_write_there_and_goes_at_exit(
    tmp_path: Path,
) -> None:
    given = tmp_path / "given"
    given.mkdir()
    (tmp_path / "env").write_text(f"export TMPDIR={given}\n")
    done = bash(
        """
        . "$1/env"
        private_tmpdir
        # A child writing a temporary file, as pulumi-kubernetes writes its kubeconfig copy.
        leftover=$(mktemp -t kubeconfigXXXXXX)
        echo "$TMPDIR $(stat -c %a "$TMPDIR") $leftover"
        exit 3
        """,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    private, mode, leftover = done.stdout.split()
    assert Path(private).parent == given
    assert mode == "700"
    assert Path(leftover).parent == Path(private)
    assert list(given.iterdir()) == []


def test_a_build_dir_goes_at_exit_with_what_is_mounted_below_it(tmp_path: Path) -> None:
    killed = tmp_path / "build.left"
    (killed / "tree").mkdir(parents=True)
    lock = tmp_path / "build.lock"  # a file beside the directories: not a build's
    lock.write_text("")
    done = bash(
        """
        build_dir "$1/build"
        [[ $BUILD_DIR == "$1"/build.?????? && -d $BUILD_DIR ]]
        [[ ! -e $1/build.left ]] || { echo "a killed build's directory is left"; exit 9; }
        mkdir "$BUILD_DIR/proc"
        mount -t tmpfs tmpfs "$BUILD_DIR/proc"
        echo "$BUILD_DIR"
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    made = Path(done.stdout.strip())
    assert not made.exists()
    assert str(made) not in Path("/proc/self/mounts").read_text()
    assert not killed.exists() and lock.exists()


def test_a_signal_ends_the_script_through_its_exit_hooks(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = (
        f'set -euo pipefail\nNAME=demo\n. "{COMMON}"\n'
        'build_dir "$1/build"\necho "$BUILD_DIR" >"$1/ready"\nsleep 600 &\nat_exit kill $!\nwait\n'
    )
    process = subprocess.Popen(["bash", "-c", script, "demo", str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            assert time.monotonic() < deadline, "the script made no build directory"
            time.sleep(0.05)
        made = Path(ready.read_text().strip())
        assert made.is_dir()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 143
    finally:
        process.kill()
    assert not made.exists()


DAEMONS = ROOT / "scripts" / "lib" / "daemons.sh"


def claim(tmp: Path, script: str) -> subprocess.CompletedProcess[str]:
    """SCRIPT with daemons.sh too, this checkout's state in $1/mine/.state."""
    return bash(f'STATE=$1/mine/.state\n. "{DAEMONS}"\n{script}', tmp)


def test_a_machine_claim_refuses_a_live_owner_and_takes_a_killed_ones_place(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other" / ".state"
    other.mkdir(parents=True)
    owner = tmp_path / "owner"
    owner.write_text(f"{other}\n")
    with subprocess.Popen(["sleep", "600"]) as sleeper:
        try:
            (other / "sleep.pid").write_text(f"{sleeper.pid}\n")
            live = claim(tmp_path, 'claim_machine "$1/owner" "the thing" "stop it first" sleep')
        finally:
            sleeper.kill()
    assert live.returncode == 1
    assert (
        f"demo: error: the thing of {other.parent} is up on this machine: stop it first\n"
        in live.stderr
    )
    assert owner.read_text() == f"{other}\n"

    # Its daemon gone (the PID now names no live sleep): a killed run's leftover.
    taken = claim(
        tmp_path,
        'claim_machine "$1/owner" "the thing" "stop it first" sleep\necho "$CLAIMED_FROM"\n'
        'release_machine "$1/owner"\n[[ ! -e $1/owner ]]',
    )
    assert taken.returncode == 0, taken.stderr
    assert f"the thing of {other.parent} was left by a run that was killed" in taken.stderr
    assert taken.stdout == f"{other}\n"

    # Another checkout's claim is not this one's to release.
    kept = claim(tmp_path, f'echo "{other}" >"$1/owner"\nrelease_machine "$1/owner"')
    assert kept.returncode == 0 and owner.read_text() == f"{other}\n"


def test_a_daemon_just_forked_is_waited_for_until_it_is_itself(tmp_path: Path) -> None:
    """Between its fork and its exec a daemon is still the shell: scripts/kube
    took one for dead in that moment on a loaded machine (its log not even
    open yet). Here the child execs a second late; `alive` holds at once after
    `until_exec`, and a child that dies before its exec ends the wait too."""
    done = claim(
        tmp_path,
        """
        ( sleep 1; exec sleep 30 ) &
        pid=$!
        alive "$pid" sleep && echo "alive before the exec"
        until_exec "$pid" sleep
        alive "$pid" sleep && echo "alive after"
        kill "$pid"
        ( sleep 1; exit 3 ) &
        start=$SECONDS
        until_exec $! sleep
        echo "gone after $((SECONDS - start)) s"
        """,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "alive after", done.stdout  # never alive before its exec
    assert int(lines[1].split()[2]) < 30  # a dead child is not waited for its 30 s
