"""SSH to a libvirt host with paramiko: key auth, strict host keys, and
``direct-streamlocal@openssh.com`` channels to the host's libvirt socket.

paramiko has no streamlocal channel: a plain ``open_channel`` of that kind
sends no payload and sshd drops the whole connection. The open message needs
``string socket_path, string "", uint32 0`` (OpenSSH PROTOCOL, 2.4).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import socket
import threading
import time

import paramiko
from paramiko.common import cMSG_CHANNEL_OPEN
from paramiko.message import Message

from providers.kvm.access import HostAccess
from providers.kvm.errors import (
    AuthenticationRefused,
    HostKeyMismatch,
    HostKeyUnknown,
    HostUnreachable,
    KeyFileError,
    LibvirtSocketError,
)

log = logging.getLogger("kvm")
# paramiko logs a dropped socket at ERROR from its own thread; the connection
# pool reports drops itself, with the host named, when it notices them.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

CONNECT_TIMEOUT = 10.0
# Bigger than paramiko's 2 MiB default: volume uploads are bulk transfers.
WINDOW_SIZE = 64 * 1024 * 1024
MAX_PACKET = 32 * 1024
_warned_insecure: set[tuple[str, str]] = set()


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _StreamlocalTransport(paramiko.Transport):  # type: ignore[misc]
    """paramiko's Transport plus the one channel kind it lacks."""

    def open_streamlocal(self, path: str, timeout: float = CONNECT_TIMEOUT) -> paramiko.Channel:
        if not self.active:
            raise paramiko.SSHException("SSH session not active")
        with self.lock:
            chanid = self._next_channel()
            m = Message()
            m.add_byte(cMSG_CHANNEL_OPEN)
            m.add_string("direct-streamlocal@openssh.com")
            m.add_int(chanid)
            m.add_int(WINDOW_SIZE)
            m.add_int(MAX_PACKET)
            m.add_string(path)
            m.add_string("")  # reserved
            m.add_int(0)  # reserved
            chan = paramiko.Channel(chanid)
            self._channels.put(chanid, chan)
            event = threading.Event()
            self.channel_events[chanid] = event
            self.channels_seen[chanid] = True
            chan._set_transport(self)
            chan._set_window(WINDOW_SIZE, MAX_PACKET)
        self._send_user_message(m)
        deadline = time.monotonic() + timeout
        while not event.wait(0.05):
            if not self.active:
                raise self.get_exception() or paramiko.SSHException("SSH session closed")
            if time.monotonic() > deadline:
                raise paramiko.SSHException("timeout opening channel")
        opened: paramiko.Channel | None = self._channels.get(chanid)
        if opened is None:
            raise self.get_exception() or paramiko.SSHException("channel open refused")
        return opened


# AEAD first: one pass for cipher and MAC, measured faster for bulk uploads.
_FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _prefer_fast_ciphers(transport: paramiko.Transport) -> None:
    options = transport.get_security_options()
    offered = tuple(options.ciphers)
    options.ciphers = tuple(c for c in _FAST_CIPHERS if c in offered) + tuple(
        c for c in offered if c not in _FAST_CIPHERS
    )


class SshSession:
    """One authenticated SSH connection to one host."""

    def __init__(self, access: HostAccess) -> None:
        self.access = access
        self.transport = self._connect()

    @property
    def active(self) -> bool:
        return bool(self.transport.is_active())

    def _load_key(self) -> paramiko.PKey:
        a = self.access
        try:
            return paramiko.PKey.from_path(a.key_file)
        except FileNotFoundError:
            raise KeyFileError(
                a.where, f"SSH key file not found: {a.key_file}", "check sshKeyFile"
            ) from None
        except paramiko.PasswordRequiredException:
            raise KeyFileError(
                a.where,
                f"SSH key {a.key_file} is encrypted",
                "use a key without passphrase for this deployment key",
            ) from None
        except (paramiko.SSHException, ValueError, OSError) as error:
            raise KeyFileError(
                a.where, f"cannot read SSH key {a.key_file}: {error}", "check sshKeyFile"
            ) from None

    def _connect(self) -> _StreamlocalTransport:
        a = self.access
        key = self._load_key()
        try:
            sock = socket.create_connection((a.address, a.port), timeout=CONNECT_TIMEOUT)
        except OSError as error:
            log.debug("provider=%s host=%s dial failed: %s", a.provider, a.host, error)
            raise HostUnreachable(
                a.where,
                f"cannot connect: {error.strerror or error}",
                "check the address and port, the network path, and that sshd runs on the host",
            ) from None
        transport = _StreamlocalTransport(sock)
        transport.set_keepalive(15)
        _prefer_fast_ciphers(transport)
        try:
            transport.start_client(timeout=CONNECT_TIMEOUT)
            self._verify_host_key(transport)
            transport.auth_publickey(a.user, key)
        except paramiko.AuthenticationException:
            transport.close()
            raise AuthenticationRefused(
                a.where,
                f"SSH authentication refused for user {a.user!r} with key {a.key_file}",
                f"check that its public key is in ~{a.user}/.ssh/authorized_keys on the host "
                "and that the account is not locked",
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as error:
            transport.close()
            if isinstance(error, HostKeyUnknown | HostKeyMismatch):
                raise
            raise HostUnreachable(
                a.where, f"SSH handshake failed: {error}", "check that sshd runs on that port"
            ) from None
        log.debug("provider=%s host=%s ssh connected as %s", a.provider, a.host, a.user)
        return transport

    def _verify_host_key(self, transport: paramiko.Transport) -> None:
        a = self.access
        offered = transport.get_remote_server_key()
        if a.insecure_ignore_host_key:
            if (a.provider, a.host) not in _warned_insecure:
                _warned_insecure.add((a.provider, a.host))
                log.warning(
                    "provider=%s host=%s host key NOT verified (insecureIgnoreHostKey): offered %s %s;"
                    " anyone on the path can impersonate this host",
                    a.provider,
                    a.host,
                    offered.get_name(),
                    fingerprint(offered),
                )
            return
        assert a.known_hosts_file is not None
        known = paramiko.HostKeys()
        try:
            known.load(a.known_hosts_file)
        except FileNotFoundError:
            raise KeyFileError(
                a.where, f"known_hosts file not found: {a.known_hosts_file}", "check knownHostsFile"
            ) from None
        entry = known.lookup(a.known_hosts_name)
        if not entry:
            raise HostKeyUnknown(
                a.where,
                f"host key {offered.get_name()} {fingerprint(offered)} is not in {a.known_hosts_file}",
                f"verify the fingerprint on the host, then add it: ssh-keyscan -p {a.port} "
                f"{a.address} >> {a.known_hosts_file}",
            )
        expected = entry.get(offered.get_name())
        if expected is None or expected.asbytes() != offered.asbytes():
            listed = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in entry.values())
            raise HostKeyMismatch(
                a.where,
                f"host key changed: offered {offered.get_name()} {fingerprint(offered)}, "
                f"{a.known_hosts_file} has {listed}",
                "if the host was reinstalled, replace its line in known_hosts; otherwise "
                "someone may be intercepting the connection",
            )

    def open_libvirt_channel(self) -> paramiko.Channel:
        """A channel to the host's libvirt socket; on refusal, find out why."""
        try:
            return self.transport.open_streamlocal(self.access.socket)
        except paramiko.ChannelException:
            raise self._diagnose_socket() from None

    def run(self, command: str, timeout: float = 15.0) -> tuple[int, str, str]:
        """Run a command on the host (diagnosis and host checks only)."""
        chan = self.transport.open_session(timeout=timeout)
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            out = chan.makefile("rb").read().decode(errors="replace")
            err = chan.makefile_stderr("rb").read().decode(errors="replace")
            return chan.recv_exit_status(), out, err
        finally:
            chan.close()

    def _diagnose_socket(self) -> LibvirtSocketError:
        a = self.access
        path = a.socket
        quoted = "'" + path.replace("'", "'\\''") + "'"
        try:
            _, out, _ = self.run(
                f"if [ -S {quoted} ]; then echo exists; fi; "
                f"if [ -r {quoted} ] && [ -w {quoted} ]; then echo rw; fi; id -nG"
            )
        except (paramiko.SSHException, OSError) as error:
            return LibvirtSocketError(
                a.where, f"cannot open libvirt socket {path}: {error}", "check sshd and libvirtd"
            )
        lines = out.split()
        if "exists" not in lines:
            return LibvirtSocketError(
                a.where,
                f"libvirt socket {path} does not exist",
                "is libvirtd running there? (and is hosts[].socket right?)",
            )
        if "rw" not in lines:
            return LibvirtSocketError(
                a.where,
                f"permission denied on libvirt socket {path} for user {a.user!r}",
                f"add the user to the libvirt group (usermod -aG libvirt {a.user}) and check "
                "unix_sock_group / unix_sock_rw_perms in libvirtd.conf",
            )
        return LibvirtSocketError(
            a.where,
            f"sshd refused to forward to {path} (the socket exists and is writable)",
            "set AllowStreamLocalForwarding yes and AllowTcpForwarding local (or yes) in "
            "sshd_config; or libvirtd is not accepting on a stale socket",
        )

    def close(self) -> None:
        self.transport.close()
