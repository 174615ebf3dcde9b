"""The project's stack file gets the autopilot's edits and nothing of the
backend's: `scripts/up` keeps a stack's ``encryptionsalt`` beside its state
(its copy in ``.pulumi-state/config/``, docs/architecture.md, "The stack's
encryptionsalt beside its state"), never in the tracked
``Pulumi.<stack>.yaml``, and rebuilds that copy from the tracked file on
every run, so the autopilot's edits there are what its next run uses.

The CLI writes a salt into a passphrase stack's config file that has none,
on any command that loads the secrets manager (`config set`, `up`, `stack
history`, ...): a fresh, unrelated one, unless
``PULUMI_FALLBACK_TO_STATE_SECRETS_MANAGER`` is set, then the state's own
(pulumi 3.274, `cmd/pulumi/stack/secrets.go`). So the autopilot runs every
command with that setting, as `scripts/up` does, and takes out again the salt
line a command wrote into a file that had none: it is the state's, which the
state keeps. A file that has a salt (its secrets were encrypted with it) is
never touched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

FALLBACK = "PULUMI_FALLBACK_TO_STATE_SECRETS_MANAGER"
_SALT_LINE = re.compile(r"^encryptionsalt:[^\n]*\n?", re.MULTILINE)
T = TypeVar("T")


def fallback_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The setting for the Automation API's workspace; an operator's own
    (in the environment the CLI inherits) wins."""
    return {} if FALLBACK in environ else {FALLBACK: "true"}


def has_salt(path: Path) -> bool:
    try:
        return _SALT_LINE.search(path.read_text()) is not None
    except FileNotFoundError:
        return False


def keeping_saltless(path: Path, command: Callable[[], T]) -> T:
    """COMMAND's result; when PATH had no salt line before it, any it wrote
    is taken out (even when COMMAND fails: the CLI may have saved it first)."""
    had = has_salt(path)
    try:
        return command()
    finally:
        if not had:
            drop_salt(path)


def drop_salt(path: Path) -> None:
    """PATH without its ``encryptionsalt:`` line (a top-level key on one
    line, as the CLI writes it), replaced atomically with its mode; a file
    without one, or none, untouched."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    kept = _SALT_LINE.sub("", text, count=1)
    if kept == text:
        return
    tmp = path.with_name(f".{path.name}.saltless-tmp")
    tmp.write_text(kept)
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
