"""Provider-harness tests of the kvm resources use the integration testbed."""

from tests.integration.conftest import testbed  # noqa: F401
