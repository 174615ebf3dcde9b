"""Ordered steps: tests of one module that build on each other (one stack
brought up, changed and destroyed, each test starting from what the one
before left), marked ``@pytest.mark.step`` and run in file order.

When a step fails (in its set-up, its body or its tear-down), its report
names it as the step that broke, and every later step of the module is
skipped with the reason "skipped because step <name> failed" instead of
failing on the state the broken step left. Tests of the module without the
mark run as usual.

Hooks, for the conftest.py of a directory whose modules use the mark
(``from tests.support.steps import pytest_configure, ...``). The state is
per process: a module's steps must run in one worker, in order (they share
a module fixture anyway).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

STEP_MARK = "step"
# Chain (the module's node id) -> the name of its first step that failed.
_BROKEN = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{STEP_MARK}: one of the module's ordered steps (tests/support/steps.py): "
        "skipped once an earlier step failed",
    )
    config.stash.setdefault(_BROKEN, {})


def _chain(item: pytest.Item) -> str | None:
    if item.get_closest_marker(STEP_MARK) is None:
        return None
    module = item.getparent(pytest.Module)
    return module.nodeid if module is not None else item.nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # First, before any fixture: a broken chain's shared fixtures are not set up again.
    chain = _chain(item)
    broken = item.config.stash.setdefault(_BROKEN, {}).get(chain or "")
    if chain is not None and broken is not None:
        pytest.skip(f"skipped because step {broken} failed")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    chain = _chain(item)
    broken = item.config.stash.setdefault(_BROKEN, {})
    if chain is not None and report.failed and chain not in broken:
        broken[chain] = item.name
        report.sections.append(
            ("ordered steps", f"step {item.name} ({report.when}) broke: the later steps skip")
        )
    return report
