"""A second libvirt connection to a host for one bulk transfer (the base
image's upload), carried by OpenSSH's own client instead of paramiko.

paramiko moves every 32 KiB channel packet through Python: about 3 CPU-s per
GiB in the provider, on the same interpreter lock as the download and its
sha256 running beside the upload. ``ssh -N -L LOCAL.sock:HOST_SOCKET`` does
the same forward in C; bench/kvm_baseimage_upload.py measures both.

The forward is made with the same key, the same known_hosts file and the
same strictness as the paramiko session (which has already checked the host
key by the time this runs), ignores every ssh_config, lives in a private
0700 directory, and ends with the transfer: it is this thread's child with a
parent-death signal, so a killed provider leaves no ssh behind. Without an
``ssh`` program, or when it cannot make the forward, the caller's own
connection carries the transfer (about a third slower, logged once per host).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt

from providers.kvm.access import HostAccess
from providers.kvm.rundir import SOCKET, private_dir
from providers.kvm.ssh import CONNECT_TIMEOUT

log = logging.getLogger("kvm")
SSH = "ssh"
# AES-GCM first: OpenSSH's default (chacha20-poly1305) measured a third slower here.
CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
READY_TIMEOUT = CONNECT_TIMEOUT + 5.0
_fell_back: set[tuple[str, str]] = set()


class ForwardFailed(Exception):
    """OpenSSH could not make the forward; the message says why."""


def ssh_argv(access: HostAccess, local: str, program: str = SSH) -> list[str]:
    """``ssh -N -L`` from ``local`` to the host's libvirt socket, trusting
    exactly what the paramiko session trusts."""
    if access.insecure_ignore_host_key:
        host_keys = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    else:
        assert access.known_hosts_file is not None
        host_keys = [
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={access.known_hosts_file}",
        ]
    options = {
        "BatchMode": "yes",  # never a prompt
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
        "GlobalKnownHostsFile": "/dev/null",
        "ConnectTimeout": str(int(CONNECT_TIMEOUT)),
        "ServerAliveInterval": "15",
        "ExitOnForwardFailure": "yes",
        "StreamLocalBindUnlink": "yes",
        "Ciphers": CIPHERS,
        "LogLevel": "ERROR",
    }
    return [
        program,
        "-F",
        "/dev/null",  # no ssh_config: the host reached is the one configured here
        "-N",
        "-T",
        "-i",
        access.key_file,
        *host_keys,
        *(arg for key, value in options.items() for arg in ("-o", f"{key}={value}")),
        "-L",
        f"{local}:{access.socket}",
        "-p",
        str(access.port),
        "-l",
        access.user,
        "--",
        access.address,
    ]


def dying_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when this process dies (util-linux's
    setpriv arms PR_SET_PDEATHSIG, then execs it). Not a preexec_fn: that
    forces a fork of this threaded, gRPC-serving process, and a child once
    aborted in gRPC's code before its exec (exit -6, "epoll_wait error")."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


class Forward:
    """A running ``ssh -N -L``: start, wait for its socket, stop."""

    def __init__(self, access: HostAccess, program: str) -> None:
        self.access = access
        self._dir = private_dir("egress-ssh-")  # 0700: only this user connects
        self.path = os.path.join(self._dir, SOCKET)
        self._errors = Path(self._dir, "ssh.err")
        with self._errors.open("wb") as errors:
            self.process = subprocess.Popen(
                dying_with_parent(ssh_argv(access, self.path, program)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.path}"

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path):
            if self.process.poll() is not None:
                raise ForwardFailed(f"ssh exited with {self.process.returncode}: {self.errors()}")
            if time.monotonic() > deadline:
                raise ForwardFailed(f"no forward after {timeout:.0f} s: {self.errors()}")
            time.sleep(0.02)

    def errors(self) -> str:
        text = self._errors.read_text(errors="replace").strip()
        return text.splitlines()[-1] if text else "no message"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def forwarded_libvirt(access: HostAccess, program: str = SSH) -> Iterator[Any]:
    """A libvirt connection to the host through OpenSSH's forward, closed
    (and the ssh stopped) on leaving; ForwardFailed when it cannot be made."""
    found = shutil.which(program)
    if found is None:
        raise ForwardFailed(f"no {program!r} program on PATH")
    forward = Forward(access, found)
    try:
        forward.wait_ready()
        try:
            conn = libvirt.open(forward.uri)
        except libvirt.libvirtError as error:
            raise ForwardFailed(
                f"libvirt did not answer through it: {error.get_error_message()} "
                f"({forward.errors()})"
            ) from None
        try:
            yield conn
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()
    finally:
        forward.stop()


def fell_back(access: HostAccess, reason: str) -> None:
    """Say once per host that its uploads go through paramiko, and why."""
    key = (access.provider, access.host)
    if key in _fell_back:
        return
    _fell_back.add(key)
    log.warning(
        "provider=%s host=%s OpenSSH forward not available (%s); bulk uploads go through "
        "the paramiko connection, about a third slower",
        access.provider,
        access.host,
        reason,
    )
