"""Fixtures shared by every test directory, the guard on programs run, and the
order that lets the whole suite run while the Pulumi CLI is still building."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Generator

import pytest

# The shared fixtures are imported here, once: a test module that imports a
# session fixture defines its own copy, which pytest sets up again for it.
from tests.support.browser import browser  # noqa: F401  (module fixture: headless Chromium)
from tests.support.build_progress import LOGS, BuildProgress, Watcher
from tests.support.client_venv import (  # noqa: F401  (session fixtures: the client's wheel, its venv)
    client_dist,
    client_venv,
)
from tests.support.kube import kube_cluster  # noqa: F401  (session fixture: scripts/kube up)
from tests.support.programs import ROOT, ExecRecorder, read_registry, unregistered
from tests.support.suite_order import (
    CLI_MARK,
    KUBE_MARK,
    distribute,
    plan,
    testbed_turn,
    timed,
)
from tests.support.testbed import (  # noqa: F401  (fixtures: the libvirt testbed, a connection to it)
    testbed,
    testbed_conn,
)

# Every program the test process starts, whatever built its argv: a program
# no package list installs fails the run here, not on a fresh machine.
_RECORDER = ExecRecorder()
sys.addaudithook(_RECORDER)


def pytest_configure(config: pytest.Config) -> None:
    distribute(config)


_WATCHER = pytest.StashKey[Watcher]()


def pytest_sessionstart(session: pytest.Session) -> None:
    # The controller of a distributed run writes the background builds'
    # progress: the workers, which wait for them, are not shown.
    config = session.config
    distributed = bool(config.getoption("numprocesses", None))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if distributed and not hasattr(config, "workerinput") and reporter is not None:

        def write(line: str) -> None:
            # On a line of its own: xdist's progress dots leave the line open.
            reporter.write("\n")
            reporter.write_line(line)

        config.stash[_WATCHER] = Watcher(BuildProgress(LOGS, write))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests of the real CLI last, and of those the ones on the Kubernetes
    # cluster: on a new machine scripts/test leaves their builds running in
    # the background while everything else runs first. Under pytest-xdist,
    # the tests of one machine-wide thing share a worker (suite_order).
    plan(config, items)


class _Gate:
    """Waits once for builds a group of tests needs (a command that waits for
    a build in progress, then links or installs it), outside any test's
    timeout, and says how long it waited."""

    def __init__(self, env: str, command: str, what: str) -> None:
        self.env, self.command, self.what = env, command, what
        self.error: str | None = None
        self.ready = False

    def wait(self, config: pytest.Config) -> None:
        if self.ready or self.error is not None:
            return
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        started = time.monotonic()
        # The suite's own tests of this order run the gate as `true`.
        command = os.environ.get(self.env, self.command)
        with subprocess.Popen(
            command.split(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ) as gate:
            try:
                _, stderr = gate.communicate(timeout=2)
            except subprocess.TimeoutExpired:
                if reporter is not None:
                    reporter.write_line(
                        f"waiting for {self.what} that scripts/test started "
                        "(progress: .cache/build-*.log)"
                    )
                _, stderr = gate.communicate()
        waited = time.monotonic() - started
        if gate.returncode != 0:
            self.error = f"{command} failed after {waited:.0f}s:\n{stderr}"
        else:
            self.ready = True
        if reporter is not None and waited >= 2:
            reporter.write_line(f"{self.what}: waited {waited:.0f}s for it")


_CLI = _Gate("EGRESS_PROXIES_CLI_GATE", f"{ROOT}/scripts/bootstrap --cli", "the Pulumi CLI")
# The cluster's binaries and images and the pulumi-kubernetes plugin.
_KUBE = _Gate(
    "EGRESS_PROXIES_KUBE_GATE",
    f"{ROOT}/scripts/bootstrap --kubernetes",
    "the Kubernetes builds and the pulumi-kubernetes plugin",
)
_GATES = ((CLI_MARK, _CLI), (KUBE_MARK, _KUBE))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None]:
    # Outside pytest-timeout's clock (its wrapper is inside this one): the
    # wait is the build's time, not the test's.
    for mark, gate in _GATES:
        if item.get_closest_marker(mark) is not None:
            gate.wait(item.config)
    # So is the wait for the testbed's turn (another worker's test on it).
    with testbed_turn(item), timed(item):
        yield


_CLI_RUNS = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CLI_RUNS] = _RECORDER.cli_runs
    for mark, gate in _GATES:
        if item.get_closest_marker(mark) is not None and gate.error is not None:
            pytest.fail(gate.error, pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    # A test that runs the CLI (in its fixtures or its body) without the mark
    # could run before the build ends and fail only on a new machine: it
    # fails here, on every machine.
    yield
    if _RECORDER.cli_runs > item.stash[_CLI_RUNS] and item.get_closest_marker(CLI_MARK) is None:
        pytest.fail(
            f"{item.nodeid} ran the pulumi CLI without @pytest.mark.{CLI_MARK} "
            "(the tests of the CLI run last, after its build)",
            pytrace=False,
        )


# Programs the workers of a distributed run saw (pytest-xdist sends each
# worker's `workeroutput` back when it ends).
_WORKERS_SAW: dict[str, str] = {}


def pytest_testnodedown(node: object, error: object) -> None:
    _WORKERS_SAW.update(getattr(node, "workeroutput", {}).get("programs", {}))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _RECORDER.active = False
    watcher = session.config.stash.get(_WATCHER, None)
    if watcher is not None:
        watcher.stop()
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a worker: the controller checks for the whole run
        output["programs"] = dict(_RECORDER.seen)
        return
    seen = {**_WORKERS_SAW, **_RECORDER.seen}
    missing = unregistered(seen, read_registry())
    if missing:
        lines = [f"  {name} (run as {seen[name]})" for name in missing]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            "the tests ran programs that scripts/programs.txt does not register "
            "(add each with the Debian package a project list installs):\n" + "\n".join(lines)
        )
        if reporter is not None:
            reporter.write_line(message, red=True, bold=True)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
