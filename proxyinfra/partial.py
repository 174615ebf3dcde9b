"""A partial run of the stack program, for the autopilot's targeted updates.

A recycle or a scale changes a few replicas; registering every other proxy
would make its cost grow with the stack (measured: the program's CPU was
14.7 s at 400 proxies against 3.1 s at 100, for a one-proxy recycle). In a
partial run the program registers only the replicas a *ticket* names, and
writes the stack's ``fleet`` output from the previous one (read from the
stack itself, secrets staying secrets) with those replicas' entries put in.

The engine keeps resources that are neither registered nor targeted, so a
partial run is safe only under the targets the autopilot gives it. That is
why the ticket is a file and not a flag: the autopilot writes it in a
private directory right before its update and removes it right after
(``ticket``), so an ``EGRESS_PROXIES_PARTIAL`` left in an operator's shell
names a file that is gone and the program refuses to run, rather than
deleting every proxy it did not register.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from proxyinfra.manifest import ManifestProxy
from proxyinfra.validation import ConfigError, ConfigIssue

ENV = "EGRESS_PROXIES_PARTIAL"
# The manifest's fields that every entry has but may be null (``zone``: a
# kubernetes or external proxy has none). The engine drops null values from
# the outputs a StackReference hands the program, so a previous entry read
# back lacks them; they are put back as null.
NULLABLE = tuple(
    name
    for name, field in ManifestProxy.model_fields.items()
    if field.is_required() and type(None) in get_args(field.annotation)
)


@dataclass(frozen=True)
class Ticket:
    stack: str
    replicas: frozenset[str]  # the replicas this run registers (those that come)


def _refuse(problem: str) -> ConfigError:
    return ConfigError([ConfigIssue(f"${ENV}", problem)])


def read_ticket(stack: str, environ: Mapping[str, str] = os.environ) -> Ticket | None:
    """The ticket named by $EGRESS_PROXIES_PARTIAL, None when it is unset.

    Refused (ConfigError, before any resource) when the file is gone or
    is not a ticket for STACK."""
    path = environ.get(ENV)
    if not path:
        return None
    remedy = "it is set by the autopilot for its own targeted updates only: unset it"
    try:
        content = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise _refuse(f"names {path!r}, which does not exist; {remedy}") from None
    except (OSError, ValueError) as error:
        raise _refuse(f"names {path!r}, which is not a ticket ({error}); {remedy}") from None
    replicas = content.get("replicas") if isinstance(content, dict) else None
    if (
        not isinstance(content, dict)
        or content.get("stack") != stack
        or not isinstance(replicas, list)
        or not all(isinstance(name, str) for name in replicas)
    ):
        raise _refuse(f"names {path!r}, which is not a ticket for stack {stack!r}; {remedy}")
    return Ticket(stack, frozenset(replicas))


@contextmanager
def ticket(stack: str, replicas: Sequence[str]) -> Iterator[dict[str, str]]:
    """A ticket for one update: yields the environment entry that names it,
    and removes it (with its private directory) when the update is over."""
    directory = tempfile.mkdtemp(prefix="egress-proxies-partial-")
    try:
        path = Path(directory) / "ticket.json"
        path.write_text(json.dumps({"stack": stack, "replicas": sorted(replicas)}))
        yield {ENV: str(path)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def merged_proxies(
    order: Sequence[str],
    registered: Mapping[str, dict[str, Any]],
    previous: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The manifest's proxies in the config's ORDER (as a whole run writes
    them): a registered replica's new entry, any other's previous one.

    A replica in neither is refused: the stack does not hold what its
    config says (an edit the last update did not apply), and only a whole
    `pulumi up` can tell what it needs."""
    before = {
        entry["name"]: {**dict.fromkeys(NULLABLE), **entry}
        for entry in (previous or {}).get("proxies") or []
        if isinstance(entry, dict) and isinstance(entry.get("name"), str)
    }
    entries = []
    for name in order:
        if name in registered:
            entries.append(registered[name])
        elif name in before:
            entries.append(before[name])
        else:
            raise _refuse(
                f"replica {name!r} is in the config but neither in this partial run nor in "
                "the stack's fleet output: run a whole `pulumi up` first"
            )
    return entries
