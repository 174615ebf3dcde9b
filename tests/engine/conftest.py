"""Hooks of the engine tests: ordered steps (`@pytest.mark.step`,
tests/support/steps.py) for the modules whose tests share one stack."""

from tests.support.steps import (  # noqa: F401  (hooks)
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)
