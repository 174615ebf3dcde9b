"""The backends the project has, by the ``type`` of their provider entries.

The one place a backend is added: its package's name below. The core reads
backends only through this registry (never by importing a backend package;
`lint-imports` enforces that), so adding one touches its own package and this
list.
"""

from __future__ import annotations

import importlib
from functools import cache

from proxyinfra.backend import Backend

MODULES: tuple[str, ...] = (
    "providers.kvm",
    "providers.gcp",
    "providers.kubernetes",
    "providers.external",
)


def backends() -> dict[str, Backend]:
    """Each registered module's ``BACKEND`` by its type (imported on first use)."""
    return _load(MODULES)


@cache
def _load(modules: tuple[str, ...]) -> dict[str, Backend]:
    found: dict[str, Backend] = {}
    for name in modules:
        backend: Backend = importlib.import_module(name).BACKEND
        if backend.type in found:
            raise RuntimeError(f"backend type {backend.type!r} registered twice ({name})")
        found[backend.type] = backend
    return found
