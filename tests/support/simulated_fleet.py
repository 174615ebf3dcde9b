"""A kvm fleet of N proxies over several hosts, for the real CLI with hosts
simulated (providers.kvm.simulated) or never contacted (a preview): shared by
bench/stack_scale and tests/engine/test_cli_simulated.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from providers.kvm.simulated import SIMULATED_HOSTS_ENV
from tests.support.stack_config import (
    host,
    image,
    key_files,
    kvm_provider,
    placement,
    proxy,
    stack_config,
)


def fleet_config(proxies: int, hosts: int, where: Path, image_url: str) -> dict[str, Any]:
    """N kvm proxies, one per host in turn, over HOSTS hosts at documentation
    addresses (the SSH key is never read: nothing reaches them)."""
    provider = kvm_provider(
        *key_files(where),
        hosts=[host(f"nas{h}", f"192.0.2.{h + 1}:22") for h in range(hosts)],
        images={"d": image(image_url)},
        ip_timeout=30,
    )
    return stack_config(
        [provider],
        [proxy(f"p{i}", "home", where=placement(zone=f"nas{i % hosts}")) for i in range(proxies)],
    )


def simulated_env(directory: Path) -> dict[str, str]:
    """The environment that makes a CLI command's kvm hosts simulated ones,
    kept in DIRECTORY from one command to the next."""
    return {SIMULATED_HOSTS_ENV: str(directory)}
