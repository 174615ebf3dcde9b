"""Fixtures shared by every test directory."""

from tests.support.testbed import testbed  # noqa: F401  (session fixture: the libvirt testbed)
