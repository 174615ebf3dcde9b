"""scripts/postgres, the tests' private PostgreSQL: a URL that answers, a
second start that changes nothing, a stop that ends exactly its own server,
data that outlives a restart and a crash, and a data directory of the
checkout's (or, where the postgres user cannot reach the checkout, one in
/var/tmp that the checkout links to)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.postgres import (
    PSQL,
    ROOT,
    PostgresServer,
    pick_port,
    private_postgres,
    process_gone,
)

# The session fixture (imported as itself: a re-export, not an unused name),
# until a conftest imports it.
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

FALLBACK_BASE = Path("/var/tmp/egress-proxies-postgres")


def backend_pids(server: PostgresServer) -> set[int]:
    """The server's processes, postmaster aside (backends and auxiliary ones)."""
    postmaster = server.pid
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                found.add(int(entry.name))
    return found


def test_start_gives_a_url_that_accepts_connections(postgres: PostgresServer) -> None:
    assert postgres.url == f"postgresql://postgres@127.0.0.1:{postgres.port}/egress"
    done = subprocess.run(
        [PSQL, "-X", "-A", "-t", postgres.url, "-c", "select 1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr
    assert postgres.psql("show listen_addresses", "show port") == f"127.0.0.1\n{postgres.port}\n"
    assert postgres.psql("show server_encoding") == "UTF8\n"


def test_a_second_start_only_prints_the_url(postgres: PostgresServer) -> None:
    pid = postgres.pid
    assert pid is not None
    started = time.monotonic()
    done = postgres.run("start")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout == postgres.url + "\n"
    assert "started" not in done.stderr and "initialised" not in done.stderr, done.stderr
    assert postgres.pid == pid
    assert elapsed < 5, f"a start of a running server took {elapsed:.1f}s"


def test_the_data_directory_is_the_checkouts_and_postgres_owns_it(
    postgres: PostgresServer,
) -> None:
    link = ROOT / ".cache" / "postgres" / str(postgres.port)
    data = postgres.data_directory
    assert data == link.resolve() / "data"
    assert postgres.psql("show data_directory") == f"{data}\n"
    if link.is_symlink():
        # Only where the postgres user cannot reach the checkout (under /root).
        reach = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(ROOT)])
        assert reach.returncode != 0, f"{link} links elsewhere, yet postgres can reach {ROOT}"
        assert data.parent.parent.parent == FALLBACK_BASE
    else:
        assert data.is_relative_to(ROOT)
    assert data.owner() == "postgres" and data.parent.owner() == "postgres"
    assert (data.parent / f".s.PGSQL.{postgres.port}").is_socket()


def test_stop_stops_that_server_only_and_a_start_keeps_its_data(
    postgres: PostgresServer,
) -> None:
    postgres.fresh_database("script_restart")
    postgres.psql(
        "create table kept (x int)", "insert into kept values (42)", database="script_restart"
    )
    with private_postgres() as other:
        other_pid, pid = other.pid, postgres.pid
        assert other_pid is not None and pid is not None and other_pid != pid

        postgres.stop()
        assert process_gone(pid), f"pid {pid} outlived scripts/postgres stop"
        assert postgres.pid is None
        assert other.pid == other_pid and other.psql("select 1") == "1\n"
        assert postgres.run("stop").returncode == 0  # a second stop: nothing to do

        postgres.start()
        assert postgres.pid not in (None, pid)
        assert postgres.psql("select x from kept", database="script_restart") == "42\n"


def test_kill_is_a_crash_that_the_next_start_recovers_from(postgres: PostgresServer) -> None:
    postgres.fresh_database("script_crash")
    postgres.psql(
        "create table kept (x int)", "insert into kept values (7)", database="script_crash"
    )
    # A client in the middle of a query, whose backend must go too.
    client = subprocess.Popen(
        [PSQL, "-X", "-d", postgres.url_for("script_crash"), "-c", "select pg_sleep(60)"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while "pg_sleep" not in postgres.psql("select query from pg_stat_activity"):
            assert time.monotonic() < deadline, "the client's query never started"
            time.sleep(0.05)
        pid = postgres.pid
        assert pid is not None
        processes = backend_pids(postgres)
        assert len(processes) >= 2  # the client's backend and the auxiliary processes

        postgres.kill()
        assert process_gone(pid)
        # A backend may still be exiting when the postmaster is gone: give the
        # kernel a moment, never forever.
        deadline = time.monotonic() + 10
        while not all(process_gone(p) for p in processes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(process_gone(p) for p in processes), [
            p for p in processes if not process_gone(p)
        ]
        assert client.wait(10) != 0
    finally:
        client.kill()
        client.communicate()
        if not postgres.running():
            postgres.start()  # the session's server, for the tests after this one

    postgres.start()
    assert postgres.psql("select x from kept", database="script_crash") == "7\n"
    log = (postgres.data_directory.parent / "postgres.log").read_text()
    assert "was interrupted" in log.rsplit("starting PostgreSQL", 1)[1], log[-2000:]


def test_fresh_database_drops_what_was_there(postgres: PostgresServer) -> None:
    url = postgres.fresh_database("script_fresh")
    assert url == f"postgresql://postgres@127.0.0.1:{postgres.port}/script_fresh"
    postgres.psql("create table t (x int)", database="script_fresh")
    postgres.fresh_database("script_fresh")
    assert (
        postgres.psql(
            "select count(*) from pg_tables where tablename = 't'", database="script_fresh"
        )
        == "0\n"
    )
    with pytest.raises(ValueError):
        postgres.fresh_database("no; drop")


def test_a_checkout_postgres_cannot_reach_keeps_its_server_in_var_tmp(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # as /root is
    scripts = private / "checkout" / "scripts"
    scripts.mkdir(parents=True)
    for name in ("postgres", "install-packages", "postgres-packages.txt"):
        shutil.copy2(ROOT / "scripts" / name, scripts / name)
    shutil.copytree(ROOT / "scripts" / "lib", scripts / "lib")
    server = PostgresServer(pick_port(), script=scripts / "postgres")
    link = private / "checkout" / ".cache" / "postgres" / str(server.port)
    target = None
    try:
        server.start()
        assert link.is_symlink()
        target = Path(os.readlink(link))
        assert target.parent.parent == FALLBACK_BASE
        assert target.parent.name.startswith("checkout-")
        assert server.data_directory == target / "data"
        assert server.psql("select 1") == "1\n"
    finally:
        server.remove()
    assert not link.is_symlink() and not target.exists()
    assert not target.parent.exists()  # nothing of this checkout's left in /var/tmp
