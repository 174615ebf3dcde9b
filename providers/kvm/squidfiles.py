"""The part of a proxy's user-data that is squid's settings: the files
squid reads (squid.conf, the password file), which a running proxy takes in
place (providers.kvm.squidpush), and the rest, which only a boot applies.

Two digests of them tell the domain's diff which changed: a new squid
setting is an update of the running domain, anything else a replacement.
Both are secret, like the seed's own digest (providers.kvm.seediso): they
are plain digests of documents that are mostly known.
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


def _document(user_data: str) -> dict[str, Any]:
    document = yaml.safe_load(user_data)
    return document if isinstance(document, dict) else {}


def _is_squids(entry: Any) -> bool:
    return isinstance(entry, dict) and posixpath.normpath(str(entry.get("path"))) in SQUID_FILES


def squid_files(user_data: str) -> list[dict[str, Any]]:
    """The ``write_files`` entries of squid's files, by path."""
    files = _document(user_data).get("write_files") or []
    return sorted((e for e in files if _is_squids(e)), key=lambda e: str(e["path"]))


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def digests(user_data: str, others: Sequence[str | None]) -> tuple[str, str]:
    """(squid's files, everything else the seed holds: the rest of USER_DATA
    and OTHERS, the vendor-data and network-config)."""
    document = _document(user_data)
    rest = dict(document)
    rest["write_files"] = [e for e in document.get("write_files") or [] if not _is_squids(e)]
    return _digest(squid_files(user_data)), _digest({"userData": rest, "others": list(others)})
