"""Private directories for the sockets a connection to a host needs.

A directory is named for the process that made it (``<prefix><pid>-<random>``)
and removed when its connection closes. The Pulumi engine ends a provider
process without letting it close anything, so every `pulumi up` would leave
one behind in the temporary directory (285 after a day of tests, measured);
each new directory therefore first removes those of its prefix whose process
is gone. Only this user's directories are touched, and only when the process
that named them no longer exists: a directory in use is never removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

_OWNED = re.compile(r"(\d+)-[^/]+")
# A socket's path must fit in sockaddr_un's sun_path: 108 bytes on Linux,
# its terminating NUL among them ("AF_UNIX path too long" otherwise).
SUN_PATH = 107
SOCKET = "libvirt.sock"
# The longest name mkdtemp gives: the prefix, a pid (pid_max is at most
# 2**22, 7 digits), "-", 8 random characters.
_NAME_ROOM = 7 + 1 + 8
# Where sockets go when the temporary directory's path leaves them no room.
SHORT_PARENT = "/tmp"


def private_dir(prefix: str, *, parent: str | None = None) -> str:
    """A new 0700 directory ``<parent>/<prefix><pid>-<random>``, after
    sweeping the directories of PREFIX that dead processes left in PARENT:
    by default the temporary directory, or /tmp when a socket in the
    directory's path would not fit in sun_path (a deep $TMPDIR: the one the
    autopilot gives each command, a CI's, a test's)."""
    where = parent if parent is not None else socket_parent(prefix)
    sweep(prefix, where)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=where)


def socket_parent(prefix: str, socket: str = SOCKET) -> str:
    where = tempfile.gettempdir()
    longest = os.path.join(where, prefix + "x" * _NAME_ROOM, socket)
    return where if len(os.fsencode(longest)) <= SUN_PATH else SHORT_PARENT


def sweep(prefix: str, parent: str) -> list[str]:
    """Removes PARENT's directories of PREFIX whose process is gone and that
    belong to this user; returns their paths."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(prefix):
                continue
            owner = _OWNED.fullmatch(entry.name[len(prefix) :])
            if owner is None or _alive(int(owner.group(1))):
                continue
            with contextlib.suppress(OSError):
                if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                    continue
                shutil.rmtree(entry.path)
                removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True
