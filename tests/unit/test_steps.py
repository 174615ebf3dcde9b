"""Ordered steps (tests/support/steps.py), on small suites run in this
process by pytester: a failed step is named, the later steps of its module
skip naming it, and nothing else is touched."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
from tests.support.steps import pytest_configure, pytest_runtest_makereport, pytest_runtest_setup
"""

CHAIN = """
import pytest

SET_UP = []


@pytest.fixture(scope="module")
def shared():
    SET_UP.append(1)
    if {fixture_fails}:
        raise RuntimeError("the shared fixture broke")
    return "stack"


@pytest.mark.step
def test_one(shared):
    assert {one_passes}, "step one broke"


@pytest.mark.step
def test_two(shared):
    assert {two_passes}, "step two broke"


@pytest.mark.step
def test_three(shared):
    pass


def test_not_a_step(shared):
    assert len(SET_UP) == 1  # the module fixture was set up once, whatever broke
"""


def chain(fixture_fails: bool = False, one_passes: bool = True, two_passes: bool = True) -> str:
    return CHAIN.format(fixture_fails=fixture_fails, one_passes=one_passes, two_passes=two_passes)


def run(pytester: pytest.Pytester, **modules: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "200")  # skip reasons in full on the verbose lines
        return pytester.runpytest("-p", "no:cacheprovider", "-v", "-rf")


def test_a_failed_step_is_named_and_the_later_steps_skip_because_of_it(
    pytester: pytest.Pytester,
) -> None:
    result = run(pytester, test_chain=chain(two_passes=False))
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "test_chain.py::test_one PASSED*",
            "test_chain.py::test_two FAILED*",
            "test_chain.py::test_three SKIPPED (skipped because step test_two failed)*",
            "test_chain.py::test_not_a_step PASSED*",
            "*- ordered steps -*",
            "step test_two (call) broke: the later steps skip",
            "FAILED test_chain.py::test_two - AssertionError: step two broke*",
        ]
    )


def test_a_broken_shared_fixture_fails_the_first_step_only(pytester: pytest.Pytester) -> None:
    result = run(pytester, test_chain=chain(fixture_fails=True))
    # The first step errors in its set-up; the others skip before the fixture
    # is asked for again, and a test that is no step errors as it would.
    result.assert_outcomes(errors=2, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "test_chain.py::test_one ERROR*",
            "test_chain.py::test_two SKIPPED (skipped because step test_one failed)*",
            "test_chain.py::test_three SKIPPED (skipped because step test_one failed)*",
            "test_chain.py::test_not_a_step ERROR*",
            "step test_one (setup) broke: the later steps skip",
        ]
    )


def test_each_module_is_its_own_chain_and_a_whole_chain_passes(pytester: pytest.Pytester) -> None:
    result = run(pytester, test_broken=chain(one_passes=False), test_whole=chain())
    result.assert_outcomes(passed=1 + 4, failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "test_broken.py::test_one FAILED*",
            "test_broken.py::test_two SKIPPED (skipped because step test_one failed)*",
            "test_broken.py::test_three SKIPPED (skipped because step test_one failed)*",
            "test_broken.py::test_not_a_step PASSED*",
            "test_whole.py::test_one PASSED*",
            "test_whole.py::test_two PASSED*",
            "test_whole.py::test_three PASSED*",
        ]
    )
