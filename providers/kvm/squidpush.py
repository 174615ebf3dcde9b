"""A squid settings change applied to a running proxy, in place, through the
qemu guest agent: no reboot, no lost lease, the same address.

The new files are taken from the proxy's seed on the host (the SeedIso was
updated before the domain: the domain reads its outputs), written beside
their places through the agent, checked by squid itself (``squid -k
parse``), moved in, squid reloaded, and its port waited for (a reload
closes and reopens it). A check that fails leaves the old files and squid
as they were. A domain whose agent does not answer (an
image without it, a guest still booting) raises :class:`NoAgent`; the
domain's update then restarts it instead, and cloud-init applies the new
seed at that boot (its instance-id changed with the user-data).

Nothing here logs or quotes a file's content: the password file holds
hashes, and squid.conf what the operator configured.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
from collections.abc import Callable
from typing import Any

import libvirt
import libvirt_qemu

from providers.kvm.errors import KvmError
from providers.kvm.iso import read_nocloud_file
from providers.kvm.squidfiles import squid_files
from providers.kvm.volumes import download_small

AGENT_TIMEOUT = 10  # seconds, one agent command
EXEC_TIMEOUT = 90.0  # seconds, the check, the moves, the reload and its port again
NEW = ".egress-new"  # beside each file, until squid has checked it
SEED_LIMIT = 4 * 1024 * 1024  # a seed is tens of KiB


class NoAgent(Exception):
    """The guest agent did not answer; the message names the command and why."""


def agent(dom: Any, command: str, arguments: dict[str, Any] | None = None) -> Any:
    """One guest agent command's ``return``; NoAgent when it cannot be asked."""
    payload = json.dumps({"execute": command} | ({"arguments": arguments} if arguments else {}))
    # The simulated hosts' domains answer for themselves (providers.kvm.simulated).
    own: Callable[[str, int, int], str] | None = getattr(dom, "qemuAgentCommand", None)
    try:
        if own is not None:
            answer = own(payload, AGENT_TIMEOUT, 0)
        else:
            answer = libvirt_qemu.qemuAgentCommand(dom, payload, AGENT_TIMEOUT, 0)
    except libvirt.libvirtError as error:
        raise NoAgent(f"{command}: {error.get_error_message() or error}") from None
    return json.loads(answer)["return"]


def seed_files(conn: Any, seed_path: str) -> list[dict[str, Any]]:
    """Squid's ``write_files`` entries in the seed at SEED_PATH on the host."""
    vol = conn.storageVolLookupByPath(seed_path)
    user_data = read_nocloud_file(download_small(conn, vol, SEED_LIMIT), "user-data")
    return squid_files(user_data.decode())


def _write(dom: Any, path: str, content: bytes) -> None:
    handle = agent(dom, "guest-file-open", {"path": path, "mode": "w"})
    try:
        agent(
            dom,
            "guest-file-write",
            {"handle": handle, "buf-b64": base64.b64encode(content).decode()},
        )
    finally:
        agent(dom, "guest-file-close", {"handle": handle})


def script(files: list[dict[str, Any]]) -> str:
    """The shell that checks, moves in and reloads: each file's owner and
    mode as cloud-init sets them, squid's check of the new squid.conf, then
    the moves, so a failed check changes nothing."""
    steps = []
    moves = []
    for entry in files:
        path = str(entry["path"])
        new = shlex.quote(path + NEW)
        steps.append(f"chown {shlex.quote(str(entry['owner']))} {new}")
        steps.append(f"chmod {shlex.quote(str(entry['permissions']))} {new}")
        moves.append(f"mv -f {new} {shlex.quote(path)}")
    conf = next(e for e in files if str(e["path"]).endswith("squid.conf"))
    check = f"squid -k parse -f {shlex.quote(str(conf['path']) + NEW)}"
    # The reload signals squid and returns: a second for squid to close its
    # port before the wait for it could pass too early.
    reload = "systemctl reload-or-restart squid && sleep 1"
    return " && ".join([*steps, check, *moves, reload, _listening(str(conf["content"]))])


LISTEN_WAIT = 30.0  # seconds: squid reopens its port a moment after a reload


def _listening(squid_conf: str) -> str:
    """A command that waits until squid accepts connections on its port
    again (a reload closes and reopens it): the update is done when the
    proxy serves, not when squid was told. python3 is cloud-init's own."""
    found = re.search(r"^http_port\s+(\S+)", squid_conf, re.MULTILINE)
    where = found.group(1) if found else "3128"
    host, _, port = where.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    tries = int(LISTEN_WAIT / 0.1)
    code = (
        "import socket, sys, time\n"
        f"for _ in range({tries}):\n"
        "    try:\n"
        f"        socket.create_connection(({host!r}, {int(port)}), 1).close()\n"
        "        sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        f"sys.exit('squid does not accept connections on port {int(port)} after its reload')\n"
    )
    return f"python3 -c {shlex.quote(code)}"


def _run(dom: Any, command: str, sleep: Callable[[float], None]) -> None:
    started = agent(
        dom,
        "guest-exec",
        {"path": "/bin/sh", "arg": ["-c", command], "capture-output": True},
    )
    deadline = time.monotonic() + EXEC_TIMEOUT
    while True:
        status = agent(dom, "guest-exec-status", {"pid": started["pid"]})
        if status.get("exited"):
            break
        if time.monotonic() > deadline:
            raise KvmError(f"squid's new settings not applied within {EXEC_TIMEOUT:.0f}s")
        sleep(0.2)
    if status.get("exitcode") != 0:
        # squid's and systemctl's own words: a line number and a directive
        # name, never the file (squid -k parse does not echo it).
        said = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
        raise KvmError(
            f"the guest refused squid's new settings (exit {status.get('exitcode')}): "
            f"{said.strip()[-500:] or 'no message'}; the old ones stay in place"
        )


def push(
    dom: Any, files: list[dict[str, Any]], sleep: Callable[[float], None] = time.sleep
) -> None:
    """FILES into the running guest of DOM, then squid reloaded (see above)."""
    if not files:
        raise KvmError("the seed holds no squid files to apply")
    for entry in files:
        _write(dom, str(entry["path"]) + NEW, str(entry["content"]).encode())
    _run(dom, script(files), sleep)
