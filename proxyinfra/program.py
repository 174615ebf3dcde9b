"""The stack program: read and validate config, build the fleet, export it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config
from pulumi.runtime import settings
from pulumi.runtime.mocks import MockMonitor

from proxyinfra.backend import Deployer
from proxyinfra.config import StackConfig
from proxyinfra.discovery_stack import deploy_discovery, discovery_issues
from proxyinfra.fleet import build_fleet
from proxyinfra.partial import read_ticket
from proxyinfra.plugins import installed
from proxyinfra.registry import backends
from proxyinfra.validation import ConfigError, ConfigIssue, validate

NAMESPACE = "egress-proxies"


def raw_config() -> dict[str, Any]:
    """Every ``egress-proxies:*`` key the engine passed, without the namespace.

    Read from the runtime's whole config rather than key by key, so a typo
    such as ``egress-proxies:proxy`` is reported instead of silently ignored.
    """
    merged: dict[str, Any] = dict(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    raw: dict[str, Any] = {}
    for key, value in merged.items():
        namespace, _, name = key.partition(":")
        if namespace == NAMESPACE and name:
            raw[name] = _decode(key, value)
    return raw


def _decode(key: str, value: Any) -> Any:
    # Structured config reaches the program as JSON text.
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise ConfigError([ConfigIssue(key, "not valid JSON from the engine")]) from None


def deployers(config: StackConfig) -> dict[str, Deployer]:
    """A deployer of every backend the config's providers use."""
    used = {entry.type for entry in config.providers.values()}
    return {
        kind: backend.deployer(config.base_dir)
        for kind, backend in backends().items()
        if kind in used
    }


def load(base_dir: Path | None = None) -> StackConfig:
    config = validate(raw_config(), base_dir or Path.cwd())
    for warning in config.warnings:
        pulumi.log.warn(warning)
    return config


def check_plugins(config: StackConfig) -> None:
    """Every resource plugin the config's providers need is installed, else one
    error per provider entry (with the install command) before any resource."""
    if isinstance(settings.get_monitor(), MockMonitor):
        return  # unit tests under set_mocks: no engine loads any plugin
    issues = []
    for index, entry in enumerate(config.providers.values()):
        plugin = backends()[entry.type].plugin
        if plugin is not None and not installed(plugin):
            issues.append(
                ConfigIssue(
                    f"providers[{index}] ({entry.name}, type {entry.type})",
                    f"needs the Pulumi plugin {plugin.binary} v{plugin.version}, which is not "
                    f"installed; install it with `{plugin.install}` (or put {plugin.binary} on PATH)",
                )
            )
    if issues:
        raise ConfigError(issues)


def check_access(config: StackConfig) -> None:
    """Each provider entry's place can be reached (a kubeconfig, its context,
    the API server), else one error per entry before any resource."""
    if isinstance(settings.get_monitor(), MockMonitor):
        return  # unit tests under set_mocks: there is no cluster to reach
    issues = []
    for index, entry in enumerate(config.providers.values()):
        problem = backends()[entry.type].check_access(entry, config.base_dir)
        if problem is not None:
            issues.append(ConfigIssue(f"providers[{index}] ({entry.name})", problem))
    if not issues:  # the cluster answers: the Secrets the discovery block names
        issues = discovery_issues(config, deployers(config))
    if issues:
        raise ConfigError(issues)


def previous_fleet() -> pulumi.Output[Any]:
    """The stack's own ``fleet`` output as its last update left it (a partial
    run's other entries; a read, so nothing of the stack changes)."""
    name = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    return pulumi.StackReference(name).get_output("fleet")


def main() -> dict[str, Any]:
    config = load()
    check_plugins(config)
    check_access(config)
    made = deployers(config)
    partial = read_ticket(pulumi.get_stack())
    fleet = build_fleet(config, made, partial, previous_fleet() if partial else None)
    outputs = {"fleet": fleet, **deploy_discovery(config, fleet, made)}
    for name, value in outputs.items():
        pulumi.export(name, value)
    return outputs
