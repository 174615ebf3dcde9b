"""The SQLite lease store: schema version, single owner, durable group commits."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from discovery.book.errors import StoreError
from discovery.book.rules import MAX_TARGET_COOLDOWNS
from discovery.sqlite.ops import (
    AddReport,
    CooldownRecord,
    EndLease,
    ForgetProxy,
    LeaseRecord,
    Prune,
    PutCooldown,
    PutLease,
    ReportRecord,
    StoredState,
    Touch,
)
from discovery.sqlite.schema import SCHEMA_VERSION
from discovery.sqlite.store import SqliteStore as LeaseStore


def lease(lease_id: str, proxy: str, expires_at: float = 100.0) -> LeaseRecord:
    return LeaseRecord(lease_id, proxy, "crawler", None, 60.0, 40.0, expires_at)


def _reopen(path: Path) -> StoredState:
    store = LeaseStore(path)
    try:
        return store.open()
    finally:
        store.close()


def test_a_new_store_is_at_the_current_schema_version_in_wal_mode(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path / "sub" / "leases.db")
    state = store.open()
    store.close()
    assert state.leases == [] and state.cooldowns == [] and state.last_used == {}
    with sqlite3.connect(tmp_path / "sub" / "leases.db") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_store_from_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        LeaseStore(path).open()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


def test_only_one_service_owns_a_store(tmp_path: Path) -> None:
    first = LeaseStore(tmp_path / "leases.db")
    first.open()
    try:
        with pytest.raises(StoreError, match="in use"):
            LeaseStore(tmp_path / "leases.db").open()
    finally:
        first.close()
    second = LeaseStore(tmp_path / "leases.db")  # the lock went with the first
    second.open()
    second.close()


def test_writes_are_durable_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"

    async def write() -> None:
        store = LeaseStore(path)
        store.open()
        await store.write(
            [
                PutLease(lease("l1", "p1")),
                PutLease(lease("l2", "p2")),
                PutCooldown(CooldownRecord("p1", "example.com", 500.0), 0.0),
                PutCooldown(CooldownRecord("p1", "example.com", 400.0), 0.0),  # never shortens
                PutCooldown(CooldownRecord("p2", "*", 10.0), 0.0),
                AddReport(ReportRecord(41.0, "l1", "p1", "crawler", "blocked", "example.com")),
            ]
        )
        await store.write([PutLease(lease("l1", "p1", expires_at=200.0)), EndLease("l2")])
        # Committed means readable by another connection now, before any close.
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT id, expires_at FROM leases").fetchall() == [("l1", 200.0)]
        store.close()

    asyncio.run(write())
    state = _reopen(path)
    assert state.leases == [lease("l1", "p1", expires_at=200.0)]
    assert state.cooldowns == [
        CooldownRecord("p1", "example.com", 500.0),
        CooldownRecord("p2", "*", 10.0),
    ]
    assert state.last_used == {"p1": 40.0, "p2": 40.0}  # kept by the store itself


def test_the_store_refuses_a_second_lease_on_one_proxy(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = LeaseStore(tmp_path / "leases.db")
        store.open()
        try:
            await store.write([PutLease(lease("l1", "p1"))])
            # Both queued together: the bad unit fails alone, the good one commits.
            bad = store.write([PutLease(lease("l2", "p1"))])
            good = store.write([PutLease(lease("l3", "p3"))])
            with pytest.raises(StoreError, match="UNIQUE"):
                await bad
            await good
        finally:
            store.close()

    asyncio.run(scenario())
    with sqlite3.connect(tmp_path / "leases.db") as db:
        assert db.execute("SELECT id FROM leases ORDER BY id").fetchall() == [("l1",), ("l3",)]


def test_concurrent_writes_are_grouped_into_few_commits(tmp_path: Path) -> None:
    commits: list[int] = []

    async def scenario() -> None:
        store = LeaseStore(tmp_path / "leases.db")
        store.on_commit = lambda ops, _seconds: commits.append(ops)
        store.open()
        try:
            # Hold the writer inside its first commit so the rest queue up behind it.
            gate = threading.Event()
            first_commit = store.on_commit

            def slow(ops: int, seconds: float) -> None:
                first_commit(ops, seconds)
                gate.wait(5)

            store.on_commit = slow
            first = store.write([PutLease(lease("l0", "p0"))])
            await asyncio.sleep(0.05)
            rest = [store.write([PutLease(lease(f"l{i}", f"p{i}"))]) for i in range(1, 300)]
            store.on_commit = first_commit
            gate.set()
            await asyncio.gather(first, *rest)
        finally:
            store.close()

    asyncio.run(scenario())
    assert sum(commits) == 300
    assert len(commits) <= 3, commits


def test_prune_and_forget(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = LeaseStore(tmp_path / "leases.db")
        store.open()
        try:
            await store.write(
                [
                    PutCooldown(CooldownRecord("p1", "*", 10.0), 0.0),
                    PutCooldown(CooldownRecord("p1", "a.example", 30.0), 0.0),
                    PutCooldown(CooldownRecord("p2", "*", 30.0), 0.0),
                    PutLease(lease("l2", "p2")),
                    AddReport(ReportRecord(1.0, "l", "p1", "c", "ok", None)),
                    AddReport(ReportRecord(20.0, "l", "p1", "c", "ok", None)),
                ]
            )
            await store.write([Prune(now=20.0, reports_before=10.0), ForgetProxy("p2")])
        finally:
            store.close()

    asyncio.run(scenario())
    with sqlite3.connect(tmp_path / "leases.db") as db:
        assert db.execute("SELECT proxy, target FROM cooldowns").fetchall() == [("p1", "a.example")]
        assert db.execute("SELECT at FROM reports").fetchall() == [(20.0,)]
        assert db.execute("SELECT count(*) FROM usage").fetchone() == (0,)


def test_reports_are_bounded_by_age_and_by_count(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = LeaseStore(tmp_path / "leases.db")
        store.open()
        try:
            await store.write(
                [AddReport(ReportRecord(float(at), "l", "p1", "c", "ok", None)) for at in range(10)]
            )
            await store.write([Prune(now=20.0, reports_before=2.0, reports_kept=5)])
        finally:
            store.close()

    asyncio.run(scenario())
    with sqlite3.connect(tmp_path / "leases.db") as db:
        # The newest five (age alone would have kept eight).
        assert db.execute("SELECT at FROM reports ORDER BY at").fetchall() == [
            (5.0,),
            (6.0,),
            (7.0,),
            (8.0,),
            (9.0,),
        ]


def test_cooldowns_per_proxy_are_capped_by_widening_to_every_target(tmp_path: Path) -> None:
    now = 1000.0
    targets = [f"t{i}.example" for i in range(MAX_TARGET_COOLDOWNS + 1)]

    async def scenario() -> None:
        store = LeaseStore(tmp_path / "leases.db")
        store.open()
        try:
            # One that is over already does not count towards the cap.
            await store.write([PutCooldown(CooldownRecord("p1", "old.example", now - 1), now)])
            for i, target in enumerate(targets[:-1]):
                await store.write([PutCooldown(CooldownRecord("p1", target, now + 1 + i), now)])
            await store.write([PutCooldown(CooldownRecord("p2", "x.example", now + 5), now)])
            with sqlite3.connect(tmp_path / "leases.db") as db:
                assert db.execute(
                    "SELECT count(*) FROM cooldowns WHERE proxy = 'p1'"
                ).fetchone() == (MAX_TARGET_COOLDOWNS + 1,)
            # One distinct target more: one cooldown everywhere, until the latest.
            await store.write([PutCooldown(CooldownRecord("p1", targets[-1], now + 100), now)])
            # A target cooling down later than '*' is kept beside it.
            await store.write([PutCooldown(CooldownRecord("p1", "y.example", now + 110), now)])
        finally:
            store.close()

    asyncio.run(scenario())
    with sqlite3.connect(tmp_path / "leases.db") as db:
        assert db.execute(
            "SELECT proxy, target, until FROM cooldowns ORDER BY proxy, target"
        ).fetchall() == [
            ("p1", "*", now + 100),
            ("p1", "y.example", now + 110),
            ("p2", "x.example", now + 5),
        ]


def test_a_store_that_failed_knows_it_until_a_write_commits(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = LeaseStore(tmp_path / "leases.db")
        store.open()
        try:
            await store.write([PutLease(lease("l1", "p1"))])
            assert store.failure is None
            with pytest.raises(StoreError):
                await store.write([PutLease(lease("l2", "p1"))])  # UNIQUE (proxy)
            assert store.failure is not None and "UNIQUE" in store.failure
            await store.write([Touch()])  # writes, changes nothing
            assert store.failure is None
        finally:
            store.close()

    asyncio.run(scenario())
    state = _reopen(tmp_path / "leases.db")
    assert [r.id for r in state.leases] == ["l1"]
