"""The discovery service when what it stands on fails: its SQLite store on a
file system that fills up (a small tmpfs, mounted for the test), a store in
a read-only directory, a broken fleet file, PostgreSQL out of reach; and the
bounds on cooldowns and reports in the shared store.

Both sides are checked after each failure: what the service answers (and
`/readyz`), and what its store holds, also after a restart."""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.selection import Selector
from discovery.sqlite.store import SqliteStore
from tests.support.discovery import (
    ROOT,
    ServerThread,
    ServiceProcess,
    free_port,
    manifest,
    proxies,
    proxy_entry,
    settings_for,
    wait_for,
    write_fleet,
)
from tests.support.lease_world import Books, World, simple_fleet
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.responders import Responders

pytestmark = pytest.mark.integration


# -- helpers -------------------------------------------------------------------------------


def mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root", pytrace=False)
    where.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)], check=True
    )


def unmount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], check=False).returncode != 0:
        subprocess.run(["umount", "--lazy", str(where)], check=True)  # still busy: detach it


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: small enough to fill in a moment."""
    where = tmp_path / "fs"
    mount_tmpfs(where, "4m")
    try:
        yield where
    finally:
        unmount(where)


def fill(directory: Path) -> Path:
    """Writes a file until the file system is full, to the last byte."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            chunk = b"\0" * size
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as error:
                assert error.errno == 28, error  # ENOSPC
    finally:
        os.close(fd)
    return path


@pytest.fixture
def responders() -> Iterator[Responders]:
    running = Responders.start(2)
    try:
        yield running
    finally:
        running.stop()


def rows(db: Path, sql: str) -> list[Any]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def ready(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=5)


# -- SQLite: a full disk ---------------------------------------------------------------------


def test_a_full_disk_changes_nothing_in_memory_or_on_disk(
    tmp_path: Path, small_fs: Path, responders: Responders
) -> None:
    fleet = tmp_path / "fleet.json"
    write_fleet(
        fleet,
        [
            proxy_entry(f"p{i}", port=p, labels={"slot": f"p{i}"})
            for i, p in enumerate(responders.ports)
        ],
    )
    db = small_fs / "leases.db"
    args = ["--fleet", str(fleet), "--db", str(db), "--listen", f"127.0.0.1:{free_port()}"]
    args += ["--probe-target", "127.0.0.1:9", "--probe-interval", "0.5"]
    args += ["--lease-cooldown", "60", "--max-lease-ttl", "120"]

    def service() -> ServiceProcess:
        return ServiceProcess(args, log_path=tmp_path / "service.log").start()

    def all_healthy(client: httpx.Client) -> bool:
        return all(p["health"] == "healthy" for p in proxies(client).values())

    running = service()
    try:
        client = httpx.Client(base_url=running.url, timeout=10)
        wait_for(lambda: all_healthy(client), timeout=15)
        kept = client.post(
            "/v1/leases",
            json={"holder": "h", "ttlSeconds": 120, "selector": {"labels": {"slot": "p0"}}},
        ).json()
        short = client.post(
            "/v1/leases",
            json={"holder": "h", "ttlSeconds": 2, "selector": {"labels": {"slot": "p1"}}},
        ).json()
        stored = rows(db, "SELECT id, expires_at FROM leases ORDER BY id")
        reports = rows(db, "SELECT count(*) FROM reports")
        filler = fill(small_fs)

        # Every change refused with a 503, and made nowhere.
        lease = f"/v1/leases/{kept['id']}"
        for answer in (
            client.delete(lease),
            client.post(f"{lease}/report", json={"outcome": "blocked", "target": "shop.example"}),
            client.post(f"{lease}/report", json={"outcome": "blocked"}),
            client.post(f"{lease}/renew", json={"ttlSeconds": 100}),
        ):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "store_unavailable"
        not_ready = ready(running.url)
        assert not_ready.status_code == 503
        assert not_ready.json()["error"] == "store_unavailable"
        assert "full" in not_ready.json()["detail"]
        assert httpx.get(running.url + "/healthz", timeout=5).status_code == 200
        view = proxies(client)
        assert view["p0"]["leased"] and view["p0"]["cooldowns"] == []
        # The short lease runs out while the disk is full: over for its holder,
        # but its proxy stays taken until the end is recorded.
        time.sleep(2.5)
        assert client.post(f"/v1/leases/{short['id']}/renew").status_code == 404
        assert proxies(client)["p1"]["leased"]
        assert client.post("/v1/leases", json={"holder": "h"}).status_code == 409
        assert rows(db, "SELECT id, expires_at FROM leases ORDER BY id") == stored
        assert rows(db, "SELECT count(*) FROM cooldowns") == [(0,)]
        assert rows(db, "SELECT count(*) FROM reports") == reports

        filler.unlink()
        wait_for(lambda: ready(running.url).status_code == 200, timeout=5)
        # The expiry was tried again: p1 is free, in memory and on disk.
        wait_for(lambda: not proxies(client)["p1"]["leased"], timeout=5)
        assert rows(db, "SELECT id FROM leases") == [(kept["id"],)]
        renewed = client.post(f"{lease}/renew", json={"ttlSeconds": 100})
        assert renewed.status_code == 200 and renewed.json()["proxy"] == kept["proxy"]
        assert running.terminate() == 0
    finally:
        running.stop()

    events = [e.get("event") for e in running.events()]
    assert "lease expiry not recorded; retrying" in events
    # After a restart the same lease is there, without the refused cooldowns.
    running = service()
    try:
        client = httpx.Client(base_url=running.url, timeout=10)
        view = proxies(client)
        assert view["p0"]["leased"] and view["p0"]["cooldowns"] == []
        assert not view["p1"]["leased"]
        assert client.post(f"/v1/leases/{kept['id']}/renew").status_code == 200
        assert client.delete(f"/v1/leases/{kept['id']}").status_code == 204
        wait_for(lambda: all_healthy(client), timeout=15)
        for slot in ("p0", "p1"):  # both proxies granted again, p0 without a UNIQUE failure
            again = client.post(
                "/v1/leases", json={"holder": "h", "selector": {"labels": {"slot": slot}}}
            )
            assert again.status_code == 201, again.text
    finally:
        running.stop()


# -- SQLite: a read-only directory -----------------------------------------------------------


def test_a_store_in_a_read_only_directory_is_a_one_line_error(tmp_path: Path) -> None:
    write_fleet(tmp_path / "fleet.json", [proxy_entry("a")])
    where = tmp_path / "ro"
    mount_tmpfs(where, "1m")
    try:
        existing = SqliteStore(where / "made.db")  # a store made while it was writable
        existing.open()
        existing.close()
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        serve = [
            sys.executable,
            "-m",
            "discovery",
            "serve",
            "--fleet",
            str(tmp_path / "fleet.json"),
        ]
        for db in (where / "new.db", where / "sub" / "new.db", where / "made.db"):
            done = subprocess.run(
                [*serve, "--listen", f"127.0.0.1:{free_port()}", "--db", str(db)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (db, done.stderr)
            [line] = done.stderr.splitlines()
            record = json.loads(line)
            assert record["event"] == "cannot start", record
            assert str(db) in record["error"]
            assert "read-only" in record["error"].lower(), record
    finally:
        unmount(where)


# -- the fleet file broken -----------------------------------------------------------------


def swap(path: Path, text: str) -> None:
    """Replaces the file at once (a rename), as `mv` would: the poller never
    reads a half-written file, which would be one more broken content."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_a_broken_fleet_file_is_reported_once_per_content_and_unreadies_the_service(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(tmp_path, file_poll=0.05)
    assert settings.fleet_file is not None
    fleet = settings.fleet_file
    write_fleet(fleet, [proxy_entry("p0")])
    caplog.set_level(logging.INFO, logger="discovery")
    with ServerThread(settings) as server:
        registry = server.service.registry

        def errors() -> float:
            value = registry.get_sample_value("discovery_fleet_loads_total", {"result": "error"})
            return value or 0.0

        def logged() -> int:
            return sum(
                1
                for r in caplog.records
                if r.getMessage() == "fleet reload failed; keeping the current fleet"
            )

        assert ready(server.url).status_code == 200
        swap(fleet, '{"version": 1, "proj')
        wait_for(lambda: ready(server.url).status_code == 503, timeout=5)
        answer = ready(server.url).json()
        assert answer["error"] == "fleet_unreadable" and "not JSON" in answer["detail"]
        time.sleep(0.5)  # ten polls
        assert (errors(), logged()) == (1, 1)
        swap(fleet, '{"version": 1, "proj')  # written again, same content
        time.sleep(0.5)
        assert (errors(), logged()) == (1, 1)
        swap(fleet, json.dumps(manifest([{"name": "p0"}])))  # other content, broken too
        wait_for(lambda: errors() == 2, timeout=5)
        time.sleep(0.5)
        assert (errors(), logged()) == (2, 2)
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
        write_fleet(fleet, [proxy_entry("p0"), proxy_entry("p1")])
        wait_for(lambda: ready(server.url).status_code == 200, timeout=5)
        assert any(r.getMessage() == "fleet readable again" for r in caplog.records)
        swap(fleet, '{"version": 1, "proj')  # broken again: reported again
        wait_for(lambda: errors() == 3, timeout=5)
        assert ready(server.url).status_code == 503


# -- PostgreSQL ------------------------------------------------------------------------------


def test_a_replica_is_not_ready_while_its_database_is_unreachable(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """...and says so without naming the database to clients, nor its
    password anywhere (defect 7: the password in a URL's query reached the
    log and every 503 while PostgreSQL was down)."""
    name = f"unreachable_{random.randrange(1 << 30)}"
    url = postgres.fresh_database(name) + "?password=hunter2&connect_timeout=5"
    fleet = tmp_path / "fleet.json"
    write_fleet(fleet, [proxy_entry("p0", port=9)])
    args = ["--fleet", str(fleet), "--db", url, "--listen", f"127.0.0.1:{free_port()}"]
    args += ["--probe-target", "127.0.0.1:9", "--probe-interval", "0.5"]
    running = ServiceProcess(args, log_path=tmp_path / "replica.log").start()
    try:
        assert ready(running.url).status_code == 200
        postgres.psql(
            f"ALTER DATABASE {name} ALLOW_CONNECTIONS false",
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            database="postgres",
        )
        wait_for(lambda: ready(running.url).status_code == 503, timeout=10)
        answer = ready(running.url).json()
        assert answer["error"] == "store_unavailable", answer
        grant = httpx.post(running.url + "/v1/leases", json={"holder": "h"}, timeout=10)
        assert grant.status_code == 503 and grant.json()["error"] == "store_unavailable"
        for said in (grant.text, ready(running.url).text):
            for secret in ("hunter2", name, "postgres@", "127.0.0.1", str(postgres.port)):
                assert secret not in said, said
        assert httpx.get(running.url + "/healthz", timeout=5).status_code == 200
        postgres.psql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true", database="postgres")
        wait_for(lambda: ready(running.url).status_code == 200, timeout=10)
    finally:
        running.stop()
        postgres.psql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true", database="postgres")
    log = (tmp_path / "replica.log").read_text()
    assert "shared store unavailable" in log and "hunter2" not in log


def test_the_shared_store_bounds_reports(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports are kept at most so many (and so long): the newest ones. (The
    cooldown cap is a lease rule: tests/integration/test_lease_rules.py.)"""
    monkeypatch.setattr("discovery.postgres.book.REPORTS_KEPT", 10)
    url = postgres.fresh_database(f"bounds_{random.randrange(1 << 30)}")

    async def scenario(w: World) -> None:
        lease = await w.book.grant("h", ttl=None, selector=Selector(), host=None)
        for i in range(66):
            await w.book.report(lease.id, "blocked", host=f"t{i}.example")
        await w.book.maintain()
        # Of 66 reports, the newest ten.
        assert w.stored_reports() == [("blocked", f"t{i}.example") for i in range(56, 66)]

    Books("postgres", url).run(simple_fleet(1), scenario, cooldown=600)
