"""A real PostgreSQL for tests: the server scripts/postgres runs (Debian's 15,
as the postgres user, on 127.0.0.1, with a data directory of the checkout's,
.cache/postgres/PORT/), driven by its commands and stopped by its PID.

    def test_x(postgres: PostgresServer) -> None:
        url = postgres.fresh_database("leases_x")   # empty, dropped first if there
        ...
        postgres.stop(); postgres.start()           # same port and data directory
        postgres.kill(); postgres.start()           # a crash, then WAL recovery

The session's server gets a port of its own (random, free, with no data
directory yet), so parallel sessions on one machine do not share one; the
session stops it and deletes its data directory at the end. With
EGRESS_PROXIES_POSTGRES_PORT=N the session uses the server on port N instead
(`scripts/postgres start --port N`, the default port being 25432), starts it
if need be, and leaves its data; it stops it only if it started it.

psql is run by path (postgresql-client-15), as the script runs it, until the
project has a Python driver.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import bindable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "postgres"
PSQL = "/usr/lib/postgresql/15/bin/psql"
DEFAULT_PORT = 25432
PORT_ENV = "EGRESS_PROXIES_POSTGRES_PORT"
# Below Linux's ephemeral ports (32768-60999 by default), so that no client
# socket of the machine takes the port between a stop and the next start.
PORTS = range(20000, 30000)
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_RUNNING = re.compile(r"^running: pid (\d+), (\S+), data directory (\S+)$")
_STOPPED = re.compile(r"^stopped: port \d+, data directory (\S+)$")


def port_is_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:PORT and no server of this checkout has
    a data directory for it (another session's, stopped for a moment)."""
    return not os.path.lexists(ROOT / ".cache" / "postgres" / str(port)) and bindable(port)


def pick_port() -> int:
    """A random free port in PORTS."""
    for port in random.sample(PORTS, 200):
        if port_is_free(port):
            return port
    raise RuntimeError(f"no free port for PostgreSQL in {PORTS.start}-{PORTS.stop - 1}")


def process_gone(pid: int) -> bool:
    """No process PID, or a zombie (this machine's init reaps late)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


class PostgresError(RuntimeError):
    pass


class PostgresServer:
    """The server of scripts/postgres on one port."""

    def __init__(self, port: int = DEFAULT_PORT, script: Path = SCRIPT) -> None:
        self.port = port
        self.script = script
        self.url = self.url_for("egress")

    def __repr__(self) -> str:
        return f"PostgresServer(port={self.port}, url={self.url!r})"

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """scripts/postgres COMMAND --port PORT; output captured, never raises."""
        return subprocess.run(
            [str(self.script), command, "--port", str(self.port)],
            cwd=self.script.parent.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _must(self, command: str) -> subprocess.CompletedProcess[str]:
        done = self.run(command)
        if done.returncode != 0:
            raise PostgresError(
                f"scripts/postgres {command} --port {self.port} failed "
                f"(exit {done.returncode}):\n{done.stderr}"
            )
        return done

    # ---- the server ---------------------------------------------------------

    def start(self) -> str:
        """Start it (initialising the data directory the first time); its URL.
        A no-op when it runs."""
        self.url = self._must("start").stdout.strip()
        return self.url

    def stop(self) -> None:
        """Fast shutdown, by its PID; a no-op when it does not run."""
        self._must("stop")

    def kill(self) -> None:
        """SIGKILL the postmaster and all its processes, as a crash would;
        start() then recovers from the WAL."""
        self._must("kill")

    def remove(self) -> None:
        """Stop it and delete its data directory."""
        self._must("remove")

    def restart(self) -> str:
        self.stop()
        return self.start()

    def status(self) -> tuple[int | None, Path]:
        """(the postmaster's PID or None, the data directory)."""
        done = self.run("status", timeout=60)
        line = done.stdout.strip()
        if done.returncode == 0 and (m := _RUNNING.match(line)):
            return int(m.group(1)), Path(m.group(3))
        if done.returncode == 3 and (m := _STOPPED.match(line)):
            return None, Path(m.group(1))
        raise PostgresError(f"scripts/postgres status: exit {done.returncode}: {line}{done.stderr}")

    @property
    def pid(self) -> int | None:
        return self.status()[0]

    @property
    def data_directory(self) -> Path:
        return self.status()[1]

    def running(self) -> bool:
        return self.pid is not None

    # ---- databases ------------------------------------------------------------

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def psql(self, *sql: str, database: str = "egress", timeout: float = 60) -> str:
        """Run each SQL command (its own transaction) with psql; the output,
        unaligned and without headers. Raises PostgresError on an error."""
        argv = [PSQL, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        argv += ["-d", self.url_for(database)]
        for command in sql:
            argv += ["-c", command]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise PostgresError(
                f"psql on {database} failed (exit {done.returncode}): {done.stderr}"
            )
        return done.stdout

    def fresh_database(self, name: str) -> str:
        """An empty database NAME (dropped first, its sessions ended, if it
        exists); its URL."""
        if not _NAME.match(name):
            raise ValueError(f"database name {name!r}: want [a-z_][a-z0-9_]*, at most 63")
        self.psql(
            f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
            f"CREATE DATABASE {name}",
            database="postgres",
        )
        return self.url_for(name)


@contextlib.contextmanager
def private_postgres(port: int | None = None) -> Iterator[PostgresServer]:
    """A server on PORT (else a random free one) for the block: started, then
    stopped by PID and its data directory deleted, unless it ran before."""
    server = PostgresServer(port or pick_port())
    ran_before = server.running()
    try:
        server.start()
        yield server
    finally:
        if not ran_before:
            server.remove()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL (see the module's docstring)."""
    if os.geteuid() != 0:
        pytest.fail(
            "scripts/postgres needs root: it runs the server as the postgres user", pytrace=False
        )
    wanted = os.environ.get(PORT_ENV)
    if not wanted:
        with private_postgres() as server:
            yield server
        return
    server = PostgresServer(int(wanted))
    ran_before = server.running()
    try:
        server.start()
        yield server
    finally:
        if not ran_before:
            server.stop()
