"""Read ``Pulumi.<stack>.yaml`` and the project's Pulumi.yaml directly, for
the command-line tools that run outside the engine (``hosts check``, ``gc``,
the autopilot) and for tests: the files and keys the CLI itself would use."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml

from proxyinfra.config import StackConfig
from proxyinfra.validation import ConfigError, ConfigIssue, validate

NAMESPACE = "egress-proxies"


# Pulumi's stack names, plain or qualified (org/project/stack). No '.' or
# '..' part: a name also makes paths (the stack file, the autopilot's state).
_STACK_NAME = re.compile(r"(?:[A-Za-z0-9_.-]{1,100}/){0,2}[A-Za-z0-9_.-]{1,100}")


def stack_name_error(stack: str) -> str | None:
    """Why STACK cannot name a stack; None when it can."""
    if _STACK_NAME.fullmatch(stack) and not {".", ".."} & set(stack.split("/")):
        return None
    return "not a stack name (letters, digits, '-', '_' and '.'; org/project/stack when qualified)"


def stack_argument(value: str) -> str:
    """``--stack`` of the operator commands (an argparse ``type``): a bad
    name is refused before anything is read, exit 2."""
    why = stack_name_error(value)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{value!r}: {why}")
    return value


def stack_parts(stack: str) -> tuple[str | None, str]:
    """(project, name) of STACK as the CLI takes it: ``name``, ``org/name``
    or ``org/project/name``; the project is None when not named.

    The short name is the one the engine goes by in URNs, in
    ``pulumi.get_stack()``, in ``Pulumi.<name>.yaml`` and in a file
    backend's paths: a qualified name only picks the org and project
    (checked by the CLI: `organization` on a file backend, the project of
    Pulumi.yaml to create one)."""
    parts = stack.split("/")
    return (parts[1] if len(parts) == 3 else None), parts[-1]


def stack_file(project_dir: Path, stack: str) -> Path:
    """The stack's config file where the CLI keeps it: ``Pulumi.<name>.yaml``
    by the short name, in the project directory or in the directory its
    Pulumi.yaml names as ``stackConfigDir`` (relative to the project)."""
    where = (_project_file(project_dir) or {}).get("stackConfigDir")
    directory = project_dir / where if isinstance(where, str) and where else project_dir
    return directory / f"Pulumi.{stack_parts(stack)[1]}.yaml"


def _project_file(project_dir: Path) -> dict[str, Any] | None:
    """The project's Pulumi.yaml, None when there is none: the one reader of
    the keys taken from it here (``name``, ``backend.url``,
    ``stackConfigDir``)."""
    path = project_dir / "Pulumi.yaml"
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return None
    except yaml.YAMLError as error:
        raise ConfigError([ConfigIssue(str(path), f"not valid YAML: {error}")]) from None
    return document if isinstance(document, dict) else {}


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
    backend = (_project_file(project_dir) or {}).get("backend")
    url = backend.get("url") if isinstance(backend, dict) else None
    return url if isinstance(url, str) and url else None


def backend_dir(project_dir: Path, env: Mapping[str, str] | None = None) -> Path | None:
    """The directory of a file backend, found as the CLI finds its backend:
    ``PULUMI_BACKEND_URL``, else ``backend.url`` in the project's Pulumi.yaml
    (a relative path from the project directory, where the CLI runs). None
    for any other backend, or when neither names one (the CLI's login
    decides then, which is not read here)."""
    named = (env if env is not None else os.environ).get("PULUMI_BACKEND_URL")
    url = named or project_backend_url(project_dir) or ""
    if not url.startswith("file://"):
        return None
    parsed = urlparse(url)
    path = Path(unquote(parsed.netloc + parsed.path)).expanduser()
    return path if path.is_absolute() else project_dir / path


def project_name(project_dir: Path) -> str:
    """The project's name from its Pulumi.yaml (proxy ids derive from it);
    the project's own name where there is none."""
    document = _project_file(project_dir)
    if document is None:
        return NAMESPACE
    name = document.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError([ConfigIssue(str(project_dir / "Pulumi.yaml"), "has no project name")])
    return name
