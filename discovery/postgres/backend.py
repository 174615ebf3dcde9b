"""A replica on the shared PostgreSQL store in the running service: the
schema is migrated before the server starts; the database holds leases,
cooldowns and health; each replica watches the database on a connection of
its own, and holds the probing slot by which the replicas share the
fleet's probing (prober.py, sharing.py).

The wiring production runs and the tests run alike: a test gives a clock
(the store's time is the database's otherwise) and drives the prober's
steps itself (`prober`)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from discovery.book.contract import LeaseBook
from discovery.book.rules import Terms
from discovery.database import PostgresUrl
from discovery.fleet import Fleet
from discovery.health_source import HealthSource
from discovery.metrics import Metrics
from discovery.postgres.book import PostgresBook
from discovery.postgres.prober import Prober
from discovery.postgres.store import PostgresStore


class PostgresBackend:
    expiry_tick = 1.0  # grants ignore expired leases; the sweep only tidies up

    def __init__(
        self, database: PostgresUrl, terms: Terms, clock: Callable[[], float] | None = None
    ) -> None:
        self._terms = terms
        self.store = PostgresStore(database, clock=clock)
        self.prober: Prober | None = None  # from start() on

    @property
    def probing(self) -> bool:
        """Whether this replica holds a probing slot (and probes its share)."""
        return self.prober is not None and self.prober.probing

    def describe(self) -> str:
        return f"postgresql {self.store.database.shown}"

    def open(self) -> None:
        self.store.migrate()

    async def start(self, fleet: Fleet, health: HealthSource, metrics: Metrics) -> LeaseBook:
        await self.store.open()
        # The health engine probes this replica's share, while it holds a slot.
        self.prober = Prober(self.store, health, probe_interval=self._terms.probe_interval)
        book = PostgresBook(
            store=self.store, probes=self.prober, metrics=metrics, terms=self._terms
        )
        await book.restore(fleet)
        return book

    def loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        assert self.prober is not None
        return {"prober": self.prober.run}

    def failure(self) -> str | None:
        # The database's reachability (prober.py), never the pool's occupancy.
        # The reason names the server (host, user, database): the log has it.
        if self.store.failure is None:
            return None
        return "PostgreSQL cannot be reached (the service's log says why)"

    async def stop(self) -> None:
        if self.prober is not None:
            await self.prober.close()
        await self.store.close()

    def close(self) -> None:
        """Nothing to free: the pool closes in stop()."""


__all__ = ["PostgresBackend"]
