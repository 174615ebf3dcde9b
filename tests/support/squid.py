"""Run a real squid on 127.0.0.1 with a config from proxyinfra.squid.

    with start_squid(loopback_settings(), password=None) as proxy:
        ... CONNECT through 127.0.0.1:proxy.port ...
        proxy.stop(); proxy.start()      # same port again

Why the work directory is not pytest's tmp_path: squid started as root drops
to the unprivileged "proxy" user before it opens its logs, and pytest's
temporary directories (/tmp/pytest-of-root, mode 0700) are closed to that
user.  Each RunningSquid makes its own directory under the system temp dir,
owned by that user, and removes it on close().

Each instance also gets its own squid service name (-n): squid names its
shared-memory segments (/dev/shm/<service>-cf__*.shm) after it, and two squids
with the same name, or a crashed one's leftovers, make the next start fail.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from health.probe import connect_request, parse_status
from proxyinfra.squid import SquidSettings, hash_password, password_file_line, render_squid_conf
from tests.support.ports import free_port as free_port  # (imported from here by many tests)

SQUID = shutil.which("squid") or "/usr/sbin/squid"
# Debian's squid, started as root, switches to this (compiled-in) user.
SQUID_USER = "proxy"
_READY_MARK = b"Accepting HTTP Socket connections"
_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 15.0
# What `squid -k parse` reports that a clean config must not produce.
_BAD_LINE = re.compile(r"ERROR|FATAL|WARNING|ALERT|Bungled", re.IGNORECASE)


def loopback_settings(**overrides: Any) -> SquidSettings:
    """Settings for tests whose clients and targets are all on 127.0.0.1.

    Production blocks loopback destinations and tunnels only to 443; a test
    target listens on 127.0.0.1 on an ephemeral port, so both are opened here.
    """
    values: dict[str, Any] = {
        "allowed_clients": ("127.0.0.1/32",),
        "connect_ports": ("1025-65535",),
        "blocked_destinations": (),
    }
    values.update(overrides)
    return SquidSettings(**values)


class RunningSquid:
    """One squid process (foreground, -N) with its own directory and port."""

    def __init__(
        self,
        settings: SquidSettings,
        password: str | None,
        port: int,
        extra_config: Sequence[str] = (),
    ) -> None:
        self.extra_config = tuple(extra_config)
        self.workdir = Path(tempfile.mkdtemp(prefix="egress-squid-"))
        self.port = port
        self.username = settings.auth_username
        self.password = password
        self.service_name = "egsq" + secrets.token_hex(6)
        self.settings = dataclasses.replace(
            settings,
            listen_address="127.0.0.1",
            port=port,
            password_file=str(self.workdir / "passwords"),
            pid_file=str(self.workdir / "squid.pid"),
            access_log=str(self.workdir / "access.log"),
            cache_log=str(self.workdir / "cache.log"),
            coredump_dir=str(self.workdir),
        )
        self.config_path = self.workdir / "squid.conf"
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._write_files()
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    @property
    def proxy_url(self) -> str:
        """http://[user:password@]127.0.0.1:PORT, credentials percent-encoded."""
        creds = ""
        if self.username is not None and self.password is not None:
            creds = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@"
        return f"http://{creds}127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _write_files(self) -> None:
        extra = "".join(f"{line}\n" for line in self.extra_config)
        self.config_path.write_text(render_squid_conf(self.settings) + extra)
        if self.username is not None:
            assert self.password is not None
            line = password_file_line(self.username, hash_password(self.password, rounds=4))
            Path(self.settings.password_file).write_text(line)
        if os.geteuid() == 0:
            user = pwd.getpwnam(SQUID_USER)
            for path in [self.workdir, *self.workdir.iterdir()]:
                os.chown(path, user.pw_uid, user.pw_gid)

    def start(self) -> None:
        """Start squid and wait until it accepts connections."""
        if self._process is not None:
            raise RuntimeError("squid is already running")
        log_start = self._cache_log_size()
        stderr = (self.workdir / "squid.stderr").open("ab")
        with stderr:
            self._process = subprocess.Popen(
                [SQUID, "-N", "-n", self.service_name, "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        self._wait_ready(log_start)

    def _cache_log_size(self) -> int:
        return len(self._cache_log_bytes())

    def _cache_log_bytes(self) -> bytes:
        path = Path(self.settings.cache_log)
        return path.read_bytes() if path.exists() else b""

    def _wait_ready(self, log_start: int) -> None:
        # squid logs this line once its listening socket is open; polling the
        # log (not the port) keeps probe connections out of the access log.
        assert self._process is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if _READY_MARK in self._cache_log_bytes()[log_start:]:
                return
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                self._remove_shm()
                raise RuntimeError(f"squid exited with {code}:\n{self.diagnostics()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"squid did not start in {_START_TIMEOUT_S} s:\n{self.diagnostics()}")

    def stop(self) -> None:
        """Stop this squid (by its PID); SIGINT is squid's fast shutdown."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._remove_shm()

    def _remove_shm(self) -> None:
        # Only segments carrying this instance's unique service name.
        for path in Path("/dev/shm").glob(f"{self.service_name}-*"):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop squid and remove its directory."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def cache_log(self) -> str:
        path = Path(self.settings.cache_log)
        return path.read_text(errors="replace") if path.exists() else ""

    def access_log(self) -> str:
        path = Path(self.settings.access_log)
        return path.read_text(errors="replace") if path.exists() else ""

    def diagnostics(self) -> str:
        stderr = self.workdir / "squid.stderr"
        err = stderr.read_text(errors="replace") if stderr.exists() else ""
        return f"--- stderr\n{err[-2000:]}--- cache.log\n{self.cache_log()[-4000:]}"

    def __enter__(self) -> RunningSquid:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_squid(
    settings: SquidSettings,
    password: str | None = None,
    *,
    port: int | None = None,
    extra_config: Sequence[str] = (),
) -> RunningSquid:
    """Start squid on 127.0.0.1 (a free port unless given) with these settings.

    settings' listen address, port and file paths are replaced by ones inside
    the instance's own directory; the rest (clients, ports, auth) is used as is.
    A password is required exactly when settings.auth_username is set.
    `extra_config` lines go after the rendered config (directives the
    renderer has no setting for, e.g. `tcp_outgoing_address 127.0.0.2`).
    """
    if (settings.auth_username is None) != (password is None):
        raise ValueError("give a password exactly when settings.auth_username is set")
    squid = RunningSquid(settings, password, port or free_port(), extra_config)
    try:
        squid.start()
    except BaseException:
        squid.close()
        raise
    return squid


def squid_parse(conf_path: Path) -> tuple[int, list[str]]:
    """`squid -k parse` of a config file: (exit code, the lines that are findings)."""
    result = subprocess.run(
        [SQUID, "-k", "parse", "-f", str(conf_path)], capture_output=True, text=True, timeout=30
    )
    output = (result.stdout + result.stderr).splitlines()
    # Echoes of our own directives ("Processing: ...") are not findings.
    findings = [line for line in output if "Processing:" not in line and _BAD_LINE.search(line)]
    return result.returncode, findings


# -- a CONNECT client at the socket level ----------------------------------------------------


def read_head(sock: socket.socket) -> bytes:
    """Bytes up to and including the end of an answer's head (maybe a little more)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} bytes of the answer")
        data += chunk
    return data


def proxy_connect(
    host: str,
    port: int,
    target: str,
    credentials: tuple[str, str] | None = None,
    *,
    source: str | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes, socket.socket]:
    """CONNECT `target` through the proxy at host:port (from `source`, an address
    of this machine, when given): (status, answer head, the open socket)."""
    sock = socket.create_connection(
        (host, port), timeout=timeout, source_address=(source, 0) if source else None
    )
    try:
        username, password = credentials if credentials is not None else (None, None)
        sock.sendall(connect_request(target, username, password))
        head = read_head(sock)
        return parse_status(head)[0], head, sock
    except BaseException:
        sock.close()
        raise


def connect_status(
    host: str, port: int, target: str, credentials: tuple[str, str] | None = None
) -> int:
    """The status the proxy answers a CONNECT to `target` with."""
    status, _, sock = proxy_connect(host, port, target, credentials)
    sock.close()
    return status


def assert_tunnel_works(sock: socket.socket) -> None:
    """200 kB of random bytes through an open tunnel to an EchoServer come back
    unchanged; closes the socket."""
    payload = os.urandom(200_000)
    received = bytearray()

    def reader() -> None:
        while len(received) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                return
            received.extend(chunk)

    thread = threading.Thread(target=reader)
    thread.start()
    sock.sendall(payload)
    thread.join(timeout=10)
    sock.close()
    assert bytes(received) == payload


# -- a target ---------------------------------------------------------------------------------


class EchoServer:
    """TCP server on 127.0.0.1 that echoes every byte back until EOF."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()
