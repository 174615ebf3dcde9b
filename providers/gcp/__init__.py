"""The gcp backend: proxies as GCP Compute VMs (pulumi-gcp), see docs/gcp-provider.md."""

from __future__ import annotations

import argparse
import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from providers.gcp import checks
from providers.gcp.config import (
    GCP_IMAGE_PATTERN,
    GCP_PROJECT_PATTERN,
    GCP_REGION_PATTERN,
    GcpProviderEntry,
)
from proxyinfra.backend import Backend, Deployer
from proxyinfra.checks import PlacementCheck, Report
from proxyinfra.config import ProviderEntry
from proxyinfra.plugins import Plugin, sdk_plugin


class GcpBackend:
    type = "gcp"
    entry_model: builtins.type[ProviderEntry] = GcpProviderEntry
    provisions = True
    takes_user_data = True
    # An instance's name is fixed: a replacement deletes it first.
    rolls = True
    adopts_leftovers = False  # a lost instance is an orphan that costs money
    plugin: Plugin | None = sdk_plugin("pulumi_gcp")
    pattern_words: Mapping[str, str] = {
        GCP_IMAGE_PATTERN: "must be an image path projects/P/global/images/family/F "
        "or projects/P/global/images/NAME",
        GCP_PROJECT_PATTERN: "must be a GCP project id: 6-30 lowercase letters, digits or '-', "
        "starting with a letter",
        GCP_REGION_PATTERN: "must be a GCP region such as europe-west1",
    }

    def check_provider(self, entry: ProviderEntry, path: str, report: Report) -> None:
        assert isinstance(entry, GcpProviderEntry)
        checks.check_provider(entry, path, report)

    check_proxy = PlacementCheck(
        GcpProviderEntry, checks.GcpTargets.of, checks.GcpTargets.of_raw, checks.check_placement
    )

    def deployer(self, base_dir: Path) -> Deployer:
        from providers.gcp.deploy import GcpDeployer  # pulumi_gcp: only for a deployment

        return GcpDeployer()

    def check_access(self, entry: ProviderEntry, base_dir: Path) -> None:
        return None  # nothing to reach before the provider plugin does

    def add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        pass  # none yet


BACKEND: Backend = GcpBackend()
