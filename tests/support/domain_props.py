"""ProxyDomain's inputs for a domain on the test driver's host
(tests/support/testdriver.py), as the provider's fast tests make them."""

from __future__ import annotations

from typing import Any

from providers.kvm.domain import DomainArgs
from tests.support.testdriver import POOL_PATH, TestHost

NAME = "proxy-0123456789"


def domain_inputs(host: TestHost, seed_parts: str | None = None, **changes: Any) -> dict[str, Any]:
    """The inputs of domain NAME on HOST (256 MiB, one vCPU, TCG), CHANGES
    laid over them by key; SEED_PARTS as the program gives it (none: an
    earlier release's)."""
    args: DomainArgs[str] = DomainArgs(
        host=host.access(),
        name=NAME,
        project="egress-proxies",
        stack="unit",
        logical_name="home-0",
        memory_mib=256,
        vcpus=1,
        domain_type="qemu",
        cpu_mode="maximum",
        firmware="uefi",
        disk_path=f"{POOL_PATH}/{NAME}.qcow2",
        seed_path=f"{POOL_PATH}/{NAME}-seed.iso",
        base_volume="base-0123.qcow2",
        seed_sha256="ab" * 32,
        ip_timeout_seconds=5,
        shutdown_timeout_seconds=1,
        seed_parts=seed_parts,
    )
    return args.to_props() | changes
