"""One lease book under test, on either store, with a fake clock: what the
lease-rule suite (tests/integration/test_lease_rules.py) runs every rule
against, and what the SQLite book's own tests build on.

Each book is built by its store's own backend, `open()` then `start()`, the
wiring the service runs (discovery/sqlite/backend.py,
discovery/postgres/backend.py), given the fake clock:

- SQLite: on a file of the test's; `Faults`, the backend's write hook,
  stands between the book and the store to fail or hold writes.
- PostgreSQL: on a fresh database of the session's server (scripts/postgres),
  with the replica's prober step (health written to the database, crawlers'
  errors handed to the engine) run before and after every call, as if its
  flush interval were zero.

Both read their health from a FakeHealth the test sets.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from discovery.book.contract import LeaseBook
from discovery.book.errors import NoProxyAvailable, StoreError
from discovery.book.rules import Terms
from discovery.database import PostgresUrl
from discovery.fleet import Fleet, parse_fleet
from discovery.metrics import Metrics, StateSnapshot
from discovery.postgres.backend import PostgresBackend
from discovery.postgres.prober import Prober
from discovery.selection import Selector
from discovery.sqlite.backend import SqliteBackend
from discovery.sqlite.book import SqliteBook
from discovery.sqlite.ops import Op, Write
from health.model import Health
from tests.support.discovery import FakeHealth, manifest, proxy_entry
from tests.support.postgres import PostgresServer

STORES = ("sqlite", "postgres")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Faults:
    """The SQLite backend's write hook: stands between the book and its store.
    While `failing`, every write fails and nothing reaches SQLite (a full
    disk); after `hold()`, writes wait until `settle()` lets each of them
    commit or fail, in order."""

    def __init__(self) -> None:
        self._real: Write | None = None
        self.failing = False
        self.held: list[tuple[Sequence[Op], asyncio.Future[None]]] | None = None

    def hook(self, real: Write) -> Write:
        self._real = real
        return self.write

    def write(self, ops: Sequence[Op]) -> Awaitable[None]:
        assert self._real is not None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failing:
            future.set_exception(StoreError("database or disk is full"))
        elif self.held is not None:
            self.held.append((ops, future))
        else:
            return self._real(ops)
        return future

    def hold(self) -> None:
        self.held = []

    async def settle(self, *commits: bool) -> None:
        """Lets the held writes go, the i-th committing if commits[i]."""
        held, self.held = self.held or [], None
        assert len(held) == len(commits), f"{len(held)} writes held"
        assert self._real is not None
        for (ops, future), commit in zip(held, commits, strict=True):
            if commit:
                await self._real(ops)
                future.set_result(None)
            else:
                future.set_exception(StoreError("database or disk is full"))
        await asyncio.sleep(0)  # the waiting callers run on
        await asyncio.sleep(0)


class Synced:
    """A PostgreSQL book whose replica probes the whole fleet with a zero
    flush interval: the prober's round runs around every call."""

    def __init__(self, book: LeaseBook, prober: Prober) -> None:
        self._book = book
        self._prober = prober

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._book, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            await self._prober.sync()
            try:
                return await attribute(*args, **kwargs)
            finally:
                await self._prober.sync()

        return call


@dataclass
class World:
    book: LeaseBook
    health: FakeHealth
    clock: Clock
    metrics: Metrics
    store: str  # "sqlite" or "postgres"
    _rows: Callable[[str], list[Any]]
    faults: Faults | None = None
    sqlite: SqliteBook | None = None  # the book itself, for the SQLite-only tests
    extra: dict[str, Any] = field(default_factory=dict)

    def rows(self, sql: str) -> list[Any]:
        """The store's own tables, for a store's own tests."""
        return self._rows(sql)

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value

    async def snapshot(self) -> StateSnapshot:
        await self.book.refresh_snapshot()
        return self.book.snapshot()

    # What the store holds, in either: (id, proxy, expires at), (proxy, target,
    # until), (outcome, target) in the order written.
    def stored_leases(self) -> list[tuple[str, str, float]]:
        if self.store == "sqlite":
            return self._rows("SELECT id, proxy, expires_at FROM leases ORDER BY proxy")
        return self._rows(
            "SELECT id, proxy, extract(epoch from expires_at)::float8 FROM discovery_leases"
            " ORDER BY proxy"
        )

    def stored_cooldowns(self) -> list[tuple[str, str, float]]:
        if self.store == "sqlite":
            return self._rows("SELECT proxy, target, until FROM cooldowns ORDER BY proxy, target")
        return self._rows(
            "SELECT proxy, target, extract(epoch from until)::float8 FROM discovery_cooldowns"
            " ORDER BY proxy, target"
        )

    def stored_reports(self) -> list[tuple[str, str | None]]:
        table = "reports" if self.store == "sqlite" else "discovery_reports"
        return self._rows(f"SELECT outcome, target FROM {table} ORDER BY seq")


def fleet_of(*entries: dict[str, Any]) -> Fleet:
    return parse_fleet(manifest(entries))


def simple_fleet(count: int, **kwargs: Any) -> Fleet:
    return fleet_of(*(proxy_entry(f"p{i}", port=4000 + i, **kwargs) for i in range(count)))


Scenario = Callable[[World], Awaitable[None]]


@dataclass
class Books:
    """Runs scenarios on one store; `database` is the SQLite file or the
    PostgreSQL URL, kept across runs of one test (a restart is a second run)."""

    store: str
    database: str

    def run(
        self,
        fleet: Fleet,
        scenario: Scenario,
        *,
        max_ttl: float = 60.0,
        cooldown: float = 300.0,
        initial: Health = Health.HEALTHY,
        clock: Clock | None = None,
        failing: bool = False,
    ) -> None:
        terms = Terms(max_ttl=max_ttl, cooldown=cooldown, probe_interval=5.0)
        clock = clock or Clock()
        if self.store == "sqlite":
            asyncio.run(
                _sqlite(Path(self.database), fleet, scenario, terms, initial, clock, failing)
            )
        else:
            assert not failing, "failing writes are the SQLite book's tests"
            asyncio.run(_postgres(self.database, fleet, scenario, terms, initial, clock))


class Listener:
    """Hands the FakeHealth's changes to the book once it exists, as the
    service's listener does."""

    def __init__(self) -> None:
        self.book: LeaseBook | None = None

    def on_health_change(self, name: str, health: Health) -> None:
        if self.book is not None:
            self.book.on_health_change(name, health)


async def _sqlite(
    path: Path,
    fleet: Fleet,
    scenario: Scenario,
    terms: Terms,
    initial: Health,
    clock: Clock,
    failing: bool,
) -> None:
    faults = Faults()
    faults.failing = failing
    backend = SqliteBackend(path, terms, clock, write_hook=faults.hook)
    metrics = Metrics(CollectorRegistry())
    listener = Listener()
    health = FakeHealth(listener, initial)

    def rows(sql: str) -> list[Any]:
        with sqlite3.connect(path) as db:
            return db.execute(sql).fetchall()

    backend.open()
    try:
        book = await backend.start(fleet, health, metrics)
        assert isinstance(book, SqliteBook)
        listener.book = book
        world = World(book, health, clock, metrics, "sqlite", rows, faults=faults, sqlite=book)
        await scenario(world)
    finally:
        await backend.stop()


async def _postgres(
    url: str,
    fleet: Fleet,
    scenario: Scenario,
    terms: Terms,
    initial: Health,
    clock: Clock,
) -> None:
    backend = PostgresBackend(PostgresUrl(url), terms, clock)
    metrics = Metrics(CollectorRegistry())
    # Health reaches a PostgreSQL book through the database (Synced), not a listener.
    health = FakeHealth(Listener(), initial)

    def rows(sql: str) -> list[Any]:
        with psycopg.connect(url) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]

    backend.open()
    try:
        book = await backend.start(fleet, health, metrics)
        prober = backend.prober
        assert prober is not None
        # The replica alone takes a probing slot: its share is the whole fleet.
        slot = await backend.store.connect_alone()
        try:
            await prober.step(slot)
            assert prober.probing and prober.share == set(fleet.proxies)
            await prober.sync()
            synced: Any = Synced(book, prober)
            await scenario(World(synced, health, clock, metrics, "postgres", rows))
        finally:
            await slot.close()
    finally:
        await backend.stop()


async def grant_all(w: World, host: str | None = None) -> list[str]:
    """Grants until the book refuses (409, everything leased); the proxies
    granted, in order. A leased proxy granted again would be a
    StoreUnavailable (the store's UNIQUE (proxy)), not this clean 409."""
    names: list[str] = []
    while len(names) <= 10:  # more than any fleet here: a loop would be a bug
        try:
            lease = await w.book.grant("other", ttl=None, selector=Selector(), host=host)
        except NoProxyAvailable as refused:
            assert refused.reason == "leased"
            return names
        names.append(lease.proxy.name)
    raise AssertionError(f"the book kept granting: {names}")


__all__ = ["STORES", "Books", "Clock", "Faults", "World", "fleet_of", "grant_all", "simple_fleet"]


@pytest.fixture(params=STORES)
def books(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Books]:
    """Each store's books on a database of its own (PostgreSQL: one more in the
    session's server; the module using this imports the `postgres` fixture)."""
    if request.param == "sqlite":
        yield Books("sqlite", str(tmp_path / "leases.db"))
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    yield Books("postgres", server.fresh_database(f"books_{random.randrange(1 << 30)}"))
