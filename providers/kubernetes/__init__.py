"""The kubernetes backend: proxies as pods (pulumi-kubernetes), see
docs/kubernetes-provider.md."""

from __future__ import annotations

import argparse
import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from providers.kubernetes import checks
from providers.kubernetes.config import (
    DOMAIN_PATTERN,
    IMAGE_REF_PATTERN,
    QUANTITY_PATTERN,
    KubernetesProviderEntry,
)
from proxyinfra.backend import Backend, Deployer
from proxyinfra.checks import Report
from proxyinfra.config import ProviderEntry, ProxyEntry
from proxyinfra.plugins import Plugin, sdk_plugin


class KubernetesBackend:
    type = "kubernetes"
    entry_model: builtins.type[ProviderEntry] = KubernetesProviderEntry
    provisions = True
    takes_user_data = False  # squid's config comes from a ConfigMap, not cloud-init
    rolls = False  # a squid change rolls each proxy's pod, replacing nothing
    adopts_leftovers = False  # not tested to take over what a killed run left
    plugin: Plugin | None = sdk_plugin("pulumi_kubernetes")
    pattern_words: Mapping[str, str] = {
        QUANTITY_PATTERN: "must be a Kubernetes quantity such as 500m, 1, 64Mi or 1Gi",
        IMAGE_REF_PATTERN: "must be a container image reference without spaces",
        DOMAIN_PATTERN: "must be a DNS domain such as cluster.local",
    }

    def check_provider(self, entry: ProviderEntry, path: str, report: Report) -> None:
        assert isinstance(entry, KubernetesProviderEntry)
        checks.check_provider(entry, path, report)

    def check_proxy(
        self,
        proxy: ProxyEntry,
        entry: ProviderEntry | None,
        raw: Mapping[str, Any],
        path: str,
        report: Report,
    ) -> None:
        checks.check_placement(proxy, path, report)

    def check_access(self, entry: ProviderEntry, base_dir: Path) -> str | None:
        assert isinstance(entry, KubernetesProviderEntry)
        from providers.kubernetes.access import access_problem

        return access_problem(entry.kubernetes, base_dir)

    def deployer(self, base_dir: Path) -> Deployer:
        from providers.kubernetes.deploy import KubernetesDeployer

        return KubernetesDeployer(base_dir)

    def add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        pass  # none yet


BACKEND: Backend = KubernetesBackend()
