"""The running service: store, fleet source, health engine and lease book
wired together, with the background work that keeps them current (lease
expiry, fleet reloads, pruning).

`open()` runs before the HTTP server starts, so a locked or unreadable store
or a fleet that cannot be read stops the service with a clear error instead
of a half-started server; `start()` and `stop()` run on the server's event
loop (from the ASGI lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from discovery.database import PostgresUrl
from discovery.fleet import Fleet, FleetError, FleetSource
from discovery.health_source import HealthFactory, HealthSource
from discovery.leases import LeaseBook, StoreUnavailable
from discovery.logs import event
from discovery.metrics import Metrics
from discovery.pgstore import PgStore
from discovery.settings import Settings
from discovery.shared import Leadership, SharedLeaseBook
from discovery.store import REPORTS_KEPT, LeaseStore, Prune, StoredState, StoreError, Touch
from health.model import Health, HealthListener

log = logging.getLogger("discovery")

REPORT_RETENTION_S = 7 * 24 * 3600.0
MAINTENANCE_INTERVAL_S = 30.0
_EXPIRY_TICK_S = 0.25  # longest a lease outlives its expiry before it is swept
SHARED_SWEEP_S = 1.0  # PostgreSQL: grants ignore expired leases; this only tidies up
STORE_PROBE_S = 1.0  # SQLite: how often a store that failed is tried with a write of its own


def engine_factory(settings: Settings) -> HealthFactory:
    """The real health engine (health/engine.py), configured from `settings`."""

    def build(listener: HealthListener, registry: CollectorRegistry) -> HealthSource:
        from health.engine import HealthEngine  # imported late: only the real service needs it

        return HealthEngine(
            target=settings.probe_target,
            interval=settings.probe_interval,
            workers=settings.health_workers,
            listener=listener,
            registry=registry,
        )

    return build


class _LoopListener:
    """Hands health changes to the lease book on the event loop's thread,
    whichever thread the engine reports from."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        self.book: LeaseBook | None = None

    def on_health_change(self, name: str, health: Health) -> None:
        book = self.book
        if book is None:
            return  # before the book exists; restore() fills the pool from scratch
        if threading.get_ident() == self._thread:
            book.on_health_change(name, health)
        else:
            self._loop.call_soon_threadsafe(book.on_health_change, name, health)


class Service:
    def __init__(
        self,
        settings: Settings,
        *,
        health_factory: HealthFactory | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._wire(settings, health_factory, registry, clock)
        assert isinstance(settings.db, Path), "an SQLite file (make_service picks)"
        self.store = LeaseStore(settings.db)
        self.store.on_commit = self.metrics.on_commit
        self._state: StoredState | None = None
        self._book: LeaseBook | None = None

    def _wire(
        self,
        settings: Settings,
        health_factory: HealthFactory | None,
        registry: CollectorRegistry | None,
        clock: Callable[[], float],
    ) -> None:
        """What every service has, whatever its store."""
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.source = FleetSource(path=settings.fleet_file, stack=settings.stack)
        self._health_factory = health_factory or engine_factory(settings)
        self._clock = clock
        self._fleet: Fleet | None = None
        self._health: HealthSource | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reload = asyncio.Event()
        self._sighup = False
        self.ready = False
        self.fleet_error: str | None = None  # why the fleet source is broken, if it is
        self._fleet_error_seen: tuple[str, str | None] | None = None
        self._fleet_retry = False  # a fleet read but not applied (the store failed)
        # Called once what lives as long as the service has been built: after
        # start() and after each fleet change (run_server passes heap.settle).
        self.settle_heap: Callable[[], None] | None = None

    @property
    def book(self) -> LeaseBook:
        if self._book is None:
            raise RuntimeError("the service has not started")
        return self._book

    def not_ready(self) -> tuple[str, str] | None:
        """Why /readyz answers 503, as (error code, detail); None when ready.
        Not ready: starting or stopping, the store failing its writes (until
        one commits again), the fleet source broken (until it reads well
        again; the last good fleet is served meanwhile)."""
        if not self.ready:
            return "not_ready", "the service is starting or stopping"
        failure = self.store_failure()
        if failure is not None:
            return "store_unavailable", f"the lease store cannot write: {failure}"
        if self.fleet_error is not None:
            return "fleet_unreadable", f"serving the last good fleet: {self.fleet_error}"
        return None

    def store_failure(self) -> str | None:
        return self.store.failure

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Opens the store and reads the fleet; raises StoreError or FleetError."""
        self._state = self.store.open()
        try:
            self._fleet = self.source.load()
        except FleetError:
            self.store.close()
            raise
        self.metrics.fleet_loads.labels("changed").inc()
        event(
            log,
            logging.INFO,
            "fleet loaded",
            source=self.source.describe(),
            project=self._fleet.project,
            stack=self._fleet.stack,
            proxies=len(self._fleet.proxies),
        )

    async def start(self) -> None:
        if self._state is None or self._fleet is None:
            self.open()
        assert self._state is not None and self._fleet is not None
        loop = asyncio.get_running_loop()
        listener = _LoopListener(loop)
        self._health = self._health_factory(listener, self.registry)
        self._book = LeaseBook(
            store=self.store,
            health=self._health,
            metrics=self.metrics,
            max_ttl=self.settings.max_lease_ttl,
            cooldown=self.settings.lease_cooldown,
            probe_interval=self.settings.probe_interval,
            clock=self._clock,
        )
        listener.book = self._book
        await self._book.restore(self._state, self._fleet)
        self._state = None  # the book owns it now
        self.metrics.watch_state(self._book.snapshot)
        await self._health.start()
        self._tasks = [
            loop.create_task(self._run("expiry", self._expiry_loop)),
            loop.create_task(self._run("fleet", self._fleet_loop)),
            loop.create_task(self._run("maintenance", self._maintenance_loop)),
            loop.create_task(self._run("store probe", self._store_probe_loop)),
        ]
        self._listen_for_sighup(loop)
        self._settle()
        self.ready = True
        event(log, logging.INFO, "service started")

    def close(self) -> None:
        """Frees the store if stop() did not run (a failed start)."""
        self.store.close()

    async def stop(self) -> None:
        await self._stop_background()
        # close() waits for the writer thread to commit what is queued.
        await asyncio.to_thread(self.store.close)
        event(log, logging.INFO, "service stopped")

    def _listen_for_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True

    async def _stop_background(self) -> None:
        """Not ready, no SIGHUP, the loops cancelled, the health engine stopped:
        what every service does before closing its store."""
        self.ready = False
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._health is not None:
            await self._health.stop()

    def _settle(self) -> None:
        if self.settle_heap is not None:
            self.settle_heap()

    def reload_fleet(self) -> None:
        """Reads the fleet again now (what SIGHUP does)."""
        self._reload.set()

    def _on_sighup(self) -> None:
        event(log, logging.INFO, "SIGHUP: reloading the fleet")
        self.reload_fleet()

    # -- background work -----------------------------------------------------------------

    async def _run(self, name: str, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        # A failing iteration is logged and retried; only cancellation ends a loop.
        while True:
            try:
                await loop_fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background %s loop failed; restarting it in 1 s", name)
                await asyncio.sleep(1.0)

    async def _expiry_loop(self) -> None:
        book = self.book
        while True:
            due = book.next_expiry()
            delay = _EXPIRY_TICK_S if due is None else due - self._clock()
            await asyncio.sleep(min(max(delay, 0.01), _EXPIRY_TICK_S))
            await book.expire_due()

    async def _fleet_loop(self) -> None:
        period = (
            self.settings.stack_refresh if self.source.polls_command else self.settings.file_poll
        )
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload.wait(), timeout=period)
            forced = self._reload.is_set()
            self._reload.clear()
            if forced or self._fleet_retry or self.source.changed():
                await self._reload_fleet(forced=forced)

    async def _reload_fleet(self, *, forced: bool = False) -> None:
        try:
            fleet = await asyncio.to_thread(self.source.load)
        except FleetError as exc:
            # Keep serving the fleet we have: a broken file must not end leases.
            self.fleet_error = str(exc)
            seen = (str(exc), exc.content)
            if seen == self._fleet_error_seen and not forced:
                return  # reported (logged, counted) when first read; SIGHUP reports again
            self._fleet_error_seen = seen
            self.metrics.fleet_loads.labels("error").inc()
            event(
                log, logging.ERROR, "fleet reload failed; keeping the current fleet", error=str(exc)
            )
            return
        if self.fleet_error is not None:
            event(log, logging.INFO, "fleet readable again", source=self.source.describe())
        self.fleet_error = self._fleet_error_seen = None
        if fleet == self._fleet:
            self._fleet_retry = False
            self.metrics.fleet_loads.labels("unchanged").inc()
            return
        try:
            change = await self.book.apply_fleet(fleet)
        except StoreUnavailable:
            # PostgreSQL: the shared store could not take it (logged); the next
            # poll tries again, with the newest fleet then.
            self._fleet_retry = True
            return
        self._fleet_retry = False
        self._fleet = fleet
        self._settle()
        self.metrics.fleet_loads.labels("changed").inc()
        event(
            log,
            logging.INFO,
            "fleet changed",
            added=change.added,
            removed=change.removed,
            changed=change.changed,
            leases_revoked=change.revoked,
            proxies=len(fleet.proxies),
        )

    async def _maintenance_loop(self) -> None:
        book = self.book
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            now = self._clock()
            await book.prune_cooldowns()
            await book.repair_pool()
            # A failure is logged by the store; the next round prunes more.
            with contextlib.suppress(StoreError):
                await self.store.write((Prune(now, now - REPORT_RETENTION_S, REPORTS_KEPT),))

    async def _store_probe_loop(self) -> None:
        """While the store fails, tries it with a write that changes nothing:
        readiness must come back once it can write, with or without traffic."""
        while True:
            await asyncio.sleep(STORE_PROBE_S)
            if self.store.failure is not None:
                with contextlib.suppress(StoreError):
                    await self.store.write((Touch(),))


class SharedService(Service):
    """A replica on a shared PostgreSQL store (discovery/shared.py): the
    database holds leases, cooldowns and health; one replica probes."""

    def __init__(
        self,
        settings: Settings,
        *,
        health_factory: HealthFactory | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        assert isinstance(settings.db, PostgresUrl)
        self._wire(settings, health_factory, registry, clock)
        self.pg = PgStore(settings.db)
        self._shared: SharedLeaseBook | None = None
        self._leadership: Leadership | None = None

    @property
    def book(self) -> SharedLeaseBook:  # type: ignore[override]
        if self._shared is None:
            raise RuntimeError("the service has not started")
        return self._shared

    @property
    def leading(self) -> bool:
        return self._leadership is not None and self._leadership.leading

    def store_failure(self) -> str | None:
        return self.pg.failure

    def open(self) -> None:
        """Migrates the database and reads the fleet; raises StoreError or FleetError."""
        self.pg.migrate()
        self._fleet = self.source.load()
        self.metrics.fleet_loads.labels("changed").inc()
        event(
            log,
            logging.INFO,
            "fleet loaded",
            source=self.source.describe(),
            project=self._fleet.project,
            stack=self._fleet.stack,
            proxies=len(self._fleet.proxies),
            store=self.pg.database.shown,
        )

    async def start(self) -> None:
        if self._fleet is None:
            self.open()
        assert self._fleet is not None
        loop = asyncio.get_running_loop()
        await self.pg.open()
        # Health reaches the book through the database, not through a listener.
        self._health = self._health_factory(_LoopListener(loop), self.registry)
        self._shared = SharedLeaseBook(
            store=self.pg,
            health=self._health,
            metrics=self.metrics,
            max_ttl=self.settings.max_lease_ttl,
            cooldown=self.settings.lease_cooldown,
            probe_interval=self.settings.probe_interval,
        )
        await self._shared.restore(self._fleet)
        self.metrics.watch_state(self._shared.snapshot)
        self._leadership = Leadership(
            self.pg, self._health, probe_interval=self.settings.probe_interval
        )
        self._tasks = [
            loop.create_task(self._run("leadership", self._leadership.run)),
            loop.create_task(self._run("expiry", self._shared_expiry_loop)),
            loop.create_task(self._run("fleet", self._fleet_loop)),
            loop.create_task(self._run("maintenance", self._shared_maintenance_loop)),
        ]
        self._listen_for_sighup(loop)
        self._settle()
        self.ready = True
        event(log, logging.INFO, "service started", store="postgresql")

    def close(self) -> None:
        """Nothing to free: the pool closes in stop()."""

    async def stop(self) -> None:
        await self._stop_background()
        await self.pg.close()
        event(log, logging.INFO, "service stopped")

    async def _shared_expiry_loop(self) -> None:
        book = self.book
        while True:
            await asyncio.sleep(SHARED_SWEEP_S)
            with contextlib.suppress(StoreUnavailable):
                await book.expire_due()
                await book.refresh_snapshot()

    async def _shared_maintenance_loop(self) -> None:
        book = self.book
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            with contextlib.suppress(StoreUnavailable):
                await book.register_fleet()
                await self.pg.prune(REPORT_RETENTION_S, REPORTS_KEPT)


AnyService = Service | SharedService


def make_service(settings: Settings, **options: Any) -> AnyService:
    """The service for `--db`: one process on SQLite, or a replica on PostgreSQL."""
    if isinstance(settings.db, PostgresUrl):
        return SharedService(settings, **options)
    return Service(settings, **options)
