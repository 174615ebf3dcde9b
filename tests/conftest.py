"""Fixtures shared by every test directory, and the guard on programs run."""

from __future__ import annotations

import sys

import pytest

from tests.support.programs import ExecRecorder, read_registry, unregistered
from tests.support.testbed import testbed  # noqa: F401  (session fixture: the libvirt testbed)

# Every program the test process starts, whatever built its argv: a program
# no package list installs fails the run here, not on a fresh machine.
_RECORDER = ExecRecorder()
sys.addaudithook(_RECORDER)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _RECORDER.active = False
    missing = unregistered(_RECORDER.seen, read_registry())
    if missing:
        lines = [f"  {name} (run as {_RECORDER.seen[name]})" for name in missing]
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
