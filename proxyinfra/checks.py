"""What a backend's config checks report into, and the checks several share.

:mod:`proxyinfra.validation` passes a :class:`Report` to every backend; each
problem is a config path and a message naming the offending value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from proxyinfra.config import ProxyEntry, resolve_path


class Report(Protocol):
    base_dir: Path  # the project directory: relative paths in the config start there
    warnings: list[str]

    def add(self, path: str, message: str) -> None: ...


def one_of(value: str | None, choices: Sequence[str], what: str, path: str, c: Report) -> bool:
    """VALUE is required and one of CHOICES (``what`` names them: machineTypes)."""
    listed = ", ".join(choices) or "none defined"
    if value is None:
        c.add(path, f"required ({what}: {listed})")
        return False
    if value not in choices:
        c.add(path, f"unknown {what.rstrip('s')} {value!r} ({what}: {listed})")
        return False
    return True


def label_values(
    proxy: ProxyEntry, rule: re.Pattern[str], words: str, path: str, c: Report
) -> None:
    """Every label value of the proxy matches the backend's RULE."""
    for key, value in proxy.labels.items():
        if not rule.fullmatch(value):
            c.add(f"{path}.labels.{key}", f"{words} (got {value!r})")


def file_exists(value: str, path: str, c: Report) -> None:
    resolved = resolve_path(value, c.base_dir)
    if not resolved.is_file():
        c.add(path, f"file not found: {resolved}")
