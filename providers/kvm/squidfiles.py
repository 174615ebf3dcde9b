"""The part of a proxy's user-data that is squid's settings: the files
squid reads (squid.conf, the password file), which a running proxy takes in
place (providers.kvm.squidpush), and the rest, which only a boot applies.

A digest of each, kept together as the domain's input ``seedParts``, tells
the domain's diff which changed: a new squid setting is an update of the
running domain, anything else a replacement. Secret, like the seed's own
digest (providers.kvm.seediso): plain digests of documents that are mostly
known.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Sequence
from typing import Any

import yaml

from proxyinfra.cloudinit import SQUID_CONF_PATH
from proxyinfra.squid import DEFAULT_PASSWORD_FILE

SQUID_FILES = (SQUID_CONF_PATH, DEFAULT_PASSWORD_FILE)


# libyaml's safe loader where PyYAML has it: the program digests every
# proxy's user-data on every run (2.7 ms a proxy with the pure-Python one).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _document(user_data: str) -> dict[str, Any]:
    document = yaml.load(user_data, Loader=_LOADER)
    return document if isinstance(document, dict) else {}


def _is_squids(entry: Any) -> bool:
    return isinstance(entry, dict) and posixpath.normpath(str(entry.get("path"))) in SQUID_FILES


def _squid_entries(document: dict[str, Any]) -> list[dict[str, Any]]:
    files = document.get("write_files") or []
    return sorted((e for e in files if _is_squids(e)), key=lambda e: str(e["path"]))


def squid_files(user_data: str) -> list[dict[str, Any]]:
    """The ``write_files`` entries of squid's files, by path."""
    return _squid_entries(_document(user_data))


DIGEST_CHARS = 16  # change detection only, and the state stays small (issue 42)


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def seed_parts(user_data: str, others: Sequence[str | None]) -> str:
    """``<squid's files>:<everything else>``, a digest of each: of squid's
    files in USER_DATA, and of the rest of it with OTHERS (the vendor-data
    and network-config). One value, so one secret in the state."""
    document = _document(user_data)
    rest = dict(document)
    rest["write_files"] = [e for e in document.get("write_files") or [] if not _is_squids(e)]
    squid = _digest(_squid_entries(document))
    return f"{squid}:{_digest({'userData': rest, 'others': list(others)})}"


def split_parts(value: str) -> tuple[str, str]:
    """(squid's files, the rest) of a ``seed_parts`` value."""
    squid, _, rest = value.partition(":")
    return squid, rest


# The domain's inputs these digests reach it as (providers/kvm/domain.py).
SEED, PARTS = "seedSha256", "seedParts"


def seed_changes(
    olds: dict[str, Any], news: dict[str, Any], replaces: list[str], updates: list[str]
) -> tuple[list[str], list[str]]:
    """The domain's REPLACES and UPDATES with the seed's keys decided: new
    squid files an update, anything else of the seed a replacement; for a
    state without the parts (an earlier release), any new seed a
    replacement, as then."""
    replaces, updates = list(replaces), list(updates)
    old_parts, new_parts = olds.get(PARTS), news.get(PARTS)
    if not old_parts:
        updates = [k for k in updates if k != PARTS]
        if SEED in updates:
            updates.remove(SEED)
            replaces.append(SEED)
        return replaces, updates
    updates = [k for k in updates if k != SEED]  # the parts say all it would
    if PARTS in updates and (
        not isinstance(new_parts, str) or split_parts(new_parts)[1] != split_parts(old_parts)[1]
    ):
        updates.remove(PARTS)
        replaces.append(PARTS)
    return replaces, updates


def squid_changed(olds: dict[str, Any], news: dict[str, Any]) -> bool:
    """Whether an update brings squid new files (both states have the parts)."""
    old, new = olds.get(PARTS), news.get(PARTS)
    if not isinstance(old, str) or not old or not isinstance(new, str):
        return False
    return split_parts(old)[0] != split_parts(new)[0]


def kept_outputs(props: dict[str, Any]) -> dict[str, Any]:
    """The domain's inputs as its outputs keep them: without the seed's
    digest when the parts are there (one secret less a proxy, issue 42)."""
    if props.get(PARTS):
        return {k: v for k, v in props.items() if k != SEED}
    return props
