"""What a backend's config checks report into, and the checks several share.

:mod:`proxyinfra.validation` passes a :class:`Report` to every backend; each
problem is a config path and a message naming the offending value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from proxyinfra.config import ProviderEntry, ProxyEntry, resolve_path

EntryT = TypeVar("EntryT", bound=ProviderEntry)
TargetsT = TypeVar("TargetsT")


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


@dataclass(frozen=True)
class PlacementCheck(Generic[EntryT, TargetsT]):
    """A backend's ``check_proxy`` when a proxy's placement is checked against
    what its provider entry offers (its targets: hosts, zones, images...).
    The targets come from the entry when it validated, else leniently from its
    raw mapping (``of_raw``), so placement errors are reported either way."""

    model: type[EntryT]
    of: Callable[[EntryT], TargetsT]
    of_raw: Callable[[Mapping[str, Any]], TargetsT]
    check: Callable[[ProxyEntry, TargetsT, str, Report], None]

    def __call__(
        self,
        proxy: ProxyEntry,
        entry: ProviderEntry | None,
        raw: Mapping[str, Any],
        path: str,
        report: Report,
    ) -> None:
        targets = self.of(entry) if isinstance(entry, self.model) else self.of_raw(raw)
        self.check(proxy, targets, path, report)
