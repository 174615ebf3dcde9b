"""The floor program's provider, in a module of its own: the SDK pickles a
provider class defined in `__main__` by value, one from a module by
reference (a few bytes), as it does the project's providers."""

from __future__ import annotations

from typing import Any

from pulumi.dynamic import CreateResult, ResourceProvider


class Nothing(ResourceProvider):
    """Creates nothing; no instance state."""

    def create(self, props: Any) -> CreateResult:
        return CreateResult(id_="nothing", outs={})
