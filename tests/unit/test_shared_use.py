"""The testbed's and the cluster's lifetime across the workers of one run
(tests/support/shared_use.py): up once, down by the last user, and only
what the run made. Two users in one process hold locks as two workers do
(flock locks belong to open files, not to processes)."""

from __future__ import annotations

import fcntl
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.support import suite_order
from tests.support.shared_use import shared_use


class Service:
    def __init__(self, up: bool = False, fail: bool = False) -> None:
        self.is_up, self.fail = up, fail
        self.ups = self.downs = 0

    def up(self) -> None:
        self.ups += 1
        if self.fail:
            raise RuntimeError("up failed")
        self.is_up = True

    def down(self) -> None:
        self.downs += 1
        self.is_up = False

    def use(self, locks: Path, keep: bool = False) -> AbstractContextManager[None]:
        return shared_use(
            "svc", is_up=lambda: self.is_up, up=self.up, down=self.down, keep=keep, locks=locks
        )


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run-1")


def test_the_last_of_two_users_takes_down_what_the_run_made(tmp_path: Path, run: None) -> None:
    service = Service()
    first, second = service.use(tmp_path), service.use(tmp_path)
    first.__enter__()
    second.__enter__()
    assert service.is_up and service.ups == 2  # `up` is quick when up already
    first.__exit__(None, None, None)
    assert service.is_up and service.downs == 0  # the other worker still uses it
    second.__exit__(None, None, None)
    assert not service.is_up and service.downs == 1


def test_a_service_that_was_up_before_the_run_stays_up(tmp_path: Path, run: None) -> None:
    service = Service(up=True)
    with service.use(tmp_path):
        pass
    assert service.is_up and service.downs == 0


def test_keep_leaves_what_the_run_made(tmp_path: Path, run: None) -> None:
    service = Service()
    with service.use(tmp_path, keep=True):
        pass
    assert service.is_up and service.downs == 0


def test_a_failed_start_is_cleaned_up_and_raised(tmp_path: Path, run: None) -> None:
    service = Service(fail=True)
    with pytest.raises(RuntimeError, match="up failed"), service.use(tmp_path):
        pass
    assert service.downs == 1
    service.fail = False
    with service.use(tmp_path):
        pass  # the locks were given back
    assert service.downs == 2


def test_a_killed_run_s_claim_is_not_taken_for_this_run_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run killed after it made the service: its locks went with its
    # processes, its claim stayed, and the service is still up.
    (tmp_path / "svc.made-by").write_text("killed-run")
    service = Service(up=True)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "next-run")
    with service.use(tmp_path):
        pass
    assert service.is_up and service.downs == 0


def held(path: Path) -> bool:
    """Whether another open file holds a lock on PATH."""
    with path.open("a") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


class Item:
    """What testbed_turn reads of a test: its fixtures and its marks."""

    def __init__(self, alone: bool) -> None:
        self.fixturenames = ["testbed"]
        self.alone = alone

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.alone and name == "testbed_alone" else None


def test_a_test_waiting_to_be_alone_goes_before_later_shared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flock grants a shared lock while another is held, so without a queue a
    worker running shared tests back to back would keep a `testbed_alone`
    test waiting for as long as it runs. Threads stand in for workers (flock
    locks belong to open files); only the order of events is asserted."""
    monkeypatch.setattr(suite_order, "LOCKS", tmp_path)
    entered: list[str] = []
    first_in, let_first_go = threading.Event(), threading.Event()

    def run(name: str, alone: bool, hold: threading.Event | None = None) -> None:
        with suite_order.testbed_turn(Item(alone)):  # type: ignore[arg-type]
            entered.append(name)
            if hold is not None:
                first_in.set()
                hold.wait()

    first = threading.Thread(target=run, args=("shared-1", False, let_first_go))
    first.start()
    first_in.wait()
    alone = threading.Thread(target=run, args=("alone", True))
    alone.start()
    while not held(tmp_path / "testbed.queue"):  # it queued
        time.sleep(0.01)
    later = threading.Thread(target=run, args=("shared-2", False))
    later.start()
    time.sleep(0.3)
    let_first_go.set()
    for thread in (first, alone, later):
        thread.join(timeout=10)
    assert entered == ["shared-1", "alone", "shared-2"]
