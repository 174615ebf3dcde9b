"""ProxyDomain's diff: what the next `pulumi up` does after a refresh."""

from __future__ import annotations

from typing import Any

from providers.kvm.domain import ProxyDomainProvider

INPUTS: dict[str, Any] = {"name": "proxy-0123456789", "memoryMib": 256, "logicalName": "home-0"}


def test_a_domain_refresh_found_stopped_is_started_in_place() -> None:
    diff = ProxyDomainProvider().diff("proxy-0123456789", {**INPUTS, "state": "shutoff"}, INPUTS)
    assert diff.changes is True
    assert not diff.replaces  # an update: the disk, NVRAM and address stay


def test_a_running_domain_with_the_same_inputs_has_no_changes() -> None:
    diff = ProxyDomainProvider().diff("proxy-0123456789", {**INPUTS, "state": "running"}, INPUTS)
    assert diff.changes is False and not diff.replaces


def test_memory_still_replaces() -> None:
    diff = ProxyDomainProvider().diff(
        "proxy-0123456789", {**INPUTS, "state": "shutoff"}, {**INPUTS, "memoryMib": 512}
    )
    assert diff.changes is True and diff.replaces == ["memoryMib"]
