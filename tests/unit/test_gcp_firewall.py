"""The gcp firewall's own guard against a rule open to the whole internet.

Validation refuses such a config first (tests/unit/test_validation.py), so
no program run ever reaches the guard; it is called directly here because it
is the last line should validation ever change.
"""

from __future__ import annotations

from typing import cast

import pulumi_gcp as gcp
import pytest

from providers.gcp.config import GcpProviderEntry
from providers.gcp.firewall import firewall_rules
from proxyinfra.config import Squid
from tests.support.stack_config import squid as squid_block

PROVIDER = GcpProviderEntry.model_validate(
    {"name": "gcp-eu", "type": "gcp", "gcp": {"project": "crawl-proj-1", "region": "europe-west1"}}
)
# Never used: the guard refuses before any rule (or provider) is touched.
NO_PROVIDER = cast(gcp.Provider, None)


@pytest.mark.parametrize(
    "allowed",
    [
        ["0.0.0.0/0"],
        ["::/0"],
        ["10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1"],  # every IPv4 address, in halves
        ["::/1"],  # holds every IPv4-mapped address: every IPv4 client
    ],
)
def test_a_rule_admitting_everyone_is_refused_without_the_opt_in(allowed: list[str]) -> None:
    squid = Squid.model_validate(squid_block(*allowed))
    with pytest.raises(ValueError, match="admits everyone without allowOpenProxyToTheInternet"):
        firewall_rules(PROVIDER, squid, "egress-proxies-dev-gcp-eu", NO_PROVIDER)
