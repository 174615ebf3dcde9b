"""A kvm fleet of N proxies over several hosts, for the real CLI with hosts
simulated (providers.kvm.simulated) or never contacted (a preview): shared by
bench/stack_scale and tests/engine/test_cli_simulated.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from providers.kvm.simulated import SIMULATED_HOSTS_ENV


def fleet_config(proxies: int, hosts: int, where: Path, image_url: str) -> dict[str, Any]:
    """N kvm proxies, one per host in turn, over HOSTS hosts at documentation
    addresses (the SSH key is never read: nothing reaches them)."""
    key, known = where / "key", where / "known"
    key.write_text("not used: simulated hosts are reached without SSH\n")
    known.write_text("")
    kvm = {
        "sshKeyFile": str(key),
        "knownHostsFile": str(known),
        "images": {"d": {"url": image_url}},
        "machineTypes": {"s": {"vcpus": 1, "memoryMiB": 512}},
        "ipTimeoutSeconds": 30,
        "hosts": [
            {"name": f"nas{h}", "address": f"192.0.2.{h + 1}:22", "user": "virt", "network": "n"}
            for h in range(hosts)
        ],
    }
    return {
        "providers": [{"name": "home", "type": "kvm", "kvm": kvm}],
        "squid": {"allowedClients": ["10.0.0.0/8"]},
        "proxies": [
            {
                "name": f"p{i}",
                "provider": "home",
                "placement": {"zone": f"nas{i % hosts}", "machineType": "s", "image": "d"},
            }
            for i in range(proxies)
        ],
    }


def simulated_env(directory: Path) -> dict[str, str]:
    """The environment that makes a CLI command's kvm hosts simulated ones,
    kept in DIRECTORY from one command to the next."""
    return {SIMULATED_HOSTS_ENV: str(directory)}
