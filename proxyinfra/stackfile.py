"""Read ``Pulumi.<stack>.yaml`` directly, for the command-line tools that run
outside the engine (``hosts check``, ``gc``) and for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from proxyinfra.config import StackConfig
from proxyinfra.validation import ConfigError, ConfigIssue, validate

NAMESPACE = "egress-proxies"


def stack_file(project_dir: Path, stack: str) -> Path:
    return project_dir / f"Pulumi.{stack}.yaml"


def read_raw(path: Path) -> dict[str, Any]:
    """The ``egress-proxies:*`` keys of a stack file, without the namespace."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError([ConfigIssue(str(path), "stack file not found")]) from None
    except yaml.YAMLError as error:
        raise ConfigError([ConfigIssue(str(path), f"not valid YAML: {error}")]) from None
    config = document.get("config") or {} if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ConfigError([ConfigIssue(f"{path}:config", "must be a mapping")])
    raw: dict[str, Any] = {}
    for key, value in config.items():
        namespace, _, name = str(key).partition(":")
        if namespace == NAMESPACE and name:
            raw[name] = value
    return raw


def load_stack(project_dir: Path, stack: str) -> StackConfig:
    return validate(read_raw(stack_file(project_dir, stack)), project_dir)


def project_backend_url(project_dir: Path) -> str | None:
    """``backend.url`` of the project's Pulumi.yaml, if it names one (the CLI
    takes it when ``PULUMI_BACKEND_URL`` is not set)."""
    try:
        document = yaml.safe_load((project_dir / "Pulumi.yaml").read_text())
    except FileNotFoundError:
        return None
    backend = document.get("backend") if isinstance(document, dict) else None
    url = backend.get("url") if isinstance(backend, dict) else None
    return url if isinstance(url, str) and url else None


def project_name(project_dir: Path) -> str:
    """The project's name from its Pulumi.yaml (proxy ids derive from it);
    the project's own name where there is none."""
    try:
        document = yaml.safe_load((project_dir / "Pulumi.yaml").read_text())
    except FileNotFoundError:
        return NAMESPACE
    name = document.get("name") if isinstance(document, dict) else None
    if not isinstance(name, str) or not name:
        raise ConfigError([ConfigIssue(str(project_dir / "Pulumi.yaml"), "has no project name")])
    return name
