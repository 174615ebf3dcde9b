"""The kvm backend: proxies as VMs on libvirt hosts reached over SSH only
(docs/kvm-provider.md)."""

from __future__ import annotations

import argparse
import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from providers.kvm import checks
from providers.kvm.config import APT_WORD, KvmProviderEntry
from proxyinfra.backend import Backend, Deployer, Place
from proxyinfra.checks import PlacementCheck, Report
from proxyinfra.config import ProviderEntry, ProxyEntry
from proxyinfra.plugins import Plugin


class KvmBackend:
    type = "kvm"
    entry_model: builtins.type[ProviderEntry] = KvmProviderEntry
    provisions = True
    takes_user_data = True
    rolls = True
    adopts_leftovers = True  # fixed volume and domain names (docs/kvm-provider.md)
    plugin: Plugin | None = None  # dynamic resources only: run by the engine's Python provider
    pattern_words: Mapping[str, str] = {
        APT_WORD: "must be one word of letters, digits, '.', '_', '/', '-' or '$' (such as $RELEASE)"
    }

    def check_provider(self, entry: ProviderEntry, path: str, report: Report) -> None:
        assert isinstance(entry, KvmProviderEntry)
        checks.check_provider(entry, path, report)

    check_proxy = PlacementCheck(
        KvmProviderEntry, checks.Targets.of, checks.Targets.of_raw, checks.check_placement
    )

    def deployer(self, base_dir: Path) -> Deployer:
        from providers.kvm.deploy import KvmDeployer  # pulumi resources: only for a deployment

        return KvmDeployer(base_dir)

    def check_access(self, entry: ProviderEntry, base_dir: Path) -> None:
        return None  # hosts: `python -m proxyinfra hosts check`; clouds: the provider plugin

    def place(self, proxy: ProxyEntry, entry: ProviderEntry) -> Place:
        from providers.kvm import room  # the connection and libvirt: only to read room

        assert isinstance(entry, KvmProviderEntry)
        return room.place(proxy, entry)

    def free(self, proxy: ProxyEntry, entry: ProviderEntry, base_dir: Path) -> Mapping[str, int]:
        from providers.kvm import room

        assert isinstance(entry, KvmProviderEntry)
        return room.free(proxy, entry, base_dir)

    def add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        from providers.kvm.commands import add_commands

        add_commands(commands)


BACKEND: Backend = KvmBackend()
