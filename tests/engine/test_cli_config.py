"""What `pulumi preview` says about a stack it cannot run: a config with
mistakes, and backends whose provider plugins are not installed. Real CLI,
no host needed (nothing may be created anywhere)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.pulumi_cli import CliStack
from tests.support.stack_config import (
    placement,
    proxy,
    squid,
    stack_config,
    unreachable_kvm_provider,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]


def test_preview_lists_every_config_mistake_at_once_and_registers_nothing(
    tmp_path: Path,
) -> None:
    config = stack_config(
        [unreachable_kvm_provider(tmp_path, cpu_mode="custom")],
        [
            proxy("a", "home", where=placement(zone="nas9")),
            proxy("b", "nowhere", where=placement("s", None)),
        ],
        squid(port=70000) | {"prot": 1},  # a typo of `port`
    )
    stack = CliStack(tmp_path / "project", "bad", config)
    done = stack.run("preview")
    assert done.returncode != 0
    out = done.stdout + done.stderr
    count = re.search(r"invalid stack config \((\d+) errors\)", out)
    assert count is not None, out[-3000:]
    for path, value in [
        ("proxies[0].placement.zone", "'nas9'"),
        ("proxies[1].provider", "'nowhere'"),
        ("squid.port", "70000"),
        ("squid.prot", "unknown key"),
        # A rule of libvirt's, which the provider process used to find only during up.
        ("providers[0].kvm.hosts[0].cpuMode", "'custom' is not a CPU model"),
    ]:
        line = next((ln for ln in out.splitlines() if path in ln), None)
        assert line is not None and value in line, (path, out[-3000:])
    assert "Traceback" not in out, "a config error is a message, not a stack trace"
    assert not re.search(r"\+\s+pulumi-python:dynamic:Resource", out)
    assert stack.resources() == []


def test_preview_of_gcp_and_kubernetes_without_their_plugins_names_them(
    tmp_path: Path,
) -> None:
    providers = [
        {"name": "gcp-eu", "type": "gcp", "gcp": {"project": "crawl-1", "region": "europe-west1"}},
        {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress"}},
    ]
    proxies = [
        proxy("eu", "gcp-eu", where=placement("e2-small", "debian-12", zone="europe-west1-b")),
        proxy("pods", "cluster"),
    ]
    config = stack_config(providers, proxies)
    stack = CliStack(tmp_path / "project", "clouds", config)
    done = stack.run("preview", timeout=300)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-3000:]
    for plugin, version in (("gcp", "10.2.0"), ("kubernetes", "4.25.0")):
        assert f"pulumi plugin install resource {plugin} v{version}" in out, out[-3000:]
