"""The running service: a store's backend (discovery/sqlite or discovery/
postgres), the fleet source, the health engine and the lease book wired
together, with the background work that keeps them current (lease expiry,
fleet reloads, maintenance, and the store's own loops).

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
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from discovery.book.contract import LeaseBook, StoreBackend
from discovery.book.errors import StoreUnavailable
from discovery.book.rules import Terms
from discovery.brake import Brake
from discovery.database import PostgresUrl
from discovery.fleet import Fleet, FleetError
from discovery.health_source import HealthFactory, HealthSource
from discovery.logs import event
from discovery.metrics import Metrics
from discovery.settings import Settings
from discovery.sources import FleetSources
from health.model import Health, HealthListener

if TYPE_CHECKING:
    from discovery.gateway import Gateway

log = logging.getLogger("discovery")

MAINTENANCE_INTERVAL_S = 30.0


def engine_factory(settings: Settings) -> HealthFactory:
    """The real health engine (health/engine.py), configured from `settings`."""

    def build(listener: HealthListener, registry: CollectorRegistry) -> HealthSource:
        from health.engine import HealthEngine  # imported late: only the real service needs it

        return HealthEngine(
            target=settings.probe_targets,
            interval=settings.probe_interval,
            workers=settings.health_workers,
            listener=listener,
            registry=registry,
        )

    return build


def make_backend(settings: Settings, clock: Callable[[], float] = time.time) -> StoreBackend:
    """The store `--db` names: an SQLite file (one service), or PostgreSQL
    shared by replicas (its own clock: the database's)."""
    terms = Terms(settings.max_lease_ttl, settings.lease_cooldown, settings.probe_interval)
    if isinstance(settings.db, PostgresUrl):
        from discovery.postgres.backend import PostgresBackend

        return PostgresBackend(settings.db, terms)
    from discovery.sqlite.backend import SqliteBackend

    return SqliteBackend(settings.db, terms, clock)


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
            return  # before the book exists; its start fills the pool from scratch
        if threading.get_ident() == self._thread:
            book.on_health_change(name, health)
        else:
            self._loop.call_soon_threadsafe(book.on_health_change, name, health)


class Service:
    def __init__(
        self,
        settings: Settings,
        *,
        backend: StoreBackend | None = None,
        health_factory: HealthFactory | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.backend = backend if backend is not None else make_backend(settings, clock)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.source = FleetSources.of(settings)
        self._health_factory = health_factory or engine_factory(settings)
        self._clock = clock
        self._fleet: Fleet | None = None
        self._health: HealthSource | None = None
        self._book: LeaseBook | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reload = asyncio.Event()
        self._sighup = False
        self.ready = False
        self.fleet_error: str | None = None  # why the fleet source is broken, if it is
        self._fleet_retry = False  # a fleet read but not applied (the store failed)
        # Called once what lives as long as the service has been built: after
        # start() and after each fleet change (run_server passes heap.settle).
        self.settle_heap: Callable[[], None] | None = None
        # One count of wrong tokens per address: the API's bearer header, the
        # status page and the gateway's proxy credentials (discovery/brake.py).
        self.brake = Brake()
        self.gateway: Gateway | None = None

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
        failure = self.backend.failure()
        if failure is not None:
            return "store_unavailable", f"the lease store cannot write: {failure}"
        if self.fleet_error is not None:
            return "fleet_unreadable", f"serving the last good fleet: {self.fleet_error}"
        return None

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Opens the store and reads the fleet; raises StoreError or FleetError."""
        self.backend.open()
        try:
            self._fleet = self.source.load()
        except FleetError:
            self.backend.close()
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
            store=self.backend.describe(),
        )

    async def start(self) -> None:
        if self._fleet is None:
            self.open()
        assert self._fleet is not None
        loop = asyncio.get_running_loop()
        listener = _LoopListener(loop)
        self._health = self._health_factory(listener, self.registry)
        self._book = await self.backend.start(self._fleet, self._health, self.metrics)
        listener.book = self._book
        self.metrics.watch_state(self._book.snapshot)
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "expiry": self._expiry_loop,
            "fleet": self._fleet_loop,
            "maintenance": self._maintenance_loop,
            **self.backend.loops(),
        }
        self._tasks = [loop.create_task(self._run(name, fn)) for name, fn in loops.items()]
        self._listen_for_sighup(loop)
        if self.settings.gateway is not None:
            from discovery.gateway import Gateway

            self.gateway = Gateway(
                self.settings.gateway,
                book=lambda: self.book,
                token=self.settings.token,
                brake=self.brake,
                registry=self.registry,
                clock=self._clock,
            )
            await self.gateway.start()
        self._settle()
        self.ready = True
        event(log, logging.INFO, "service started", store=self.backend.describe().split()[0])

    def probe_targets(self) -> list[tuple[str, bool]]:
        """Each probe target and whether it looks down; none before start()."""
        return self._health.probe_targets() if self._health is not None else []

    def close(self) -> None:
        """Frees the store if stop() did not run (a failed start)."""
        self.backend.close()

    async def stop(self) -> None:
        self.ready = False
        if self.gateway is not None:
            await self.gateway.stop()  # its leases are given back while the store is open
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._health is not None:
            await self._health.stop()
        await self.backend.stop()
        event(log, logging.INFO, "service stopped")

    def _listen_for_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True

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
        book, tick = self.book, self.backend.expiry_tick
        while True:
            due = book.next_expiry()
            delay = tick if due is None else due - self._clock()
            await asyncio.sleep(min(max(delay, 0.01), tick))
            with contextlib.suppress(StoreUnavailable):  # logged; the next tick tries again
                await book.expire_due()

    async def _maintenance_loop(self) -> None:
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            with contextlib.suppress(StoreUnavailable):  # logged; the next round does more
                await self.book.maintain()

    async def _fleet_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload.wait(), timeout=self.source.period)
            forced = self._reload.is_set()
            self._reload.clear()
            if forced or self._fleet_retry or self.source.due():
                await self._reload_fleet(forced=forced)

    async def _reload_fleet(self, *, forced: bool = False) -> None:
        try:
            result = await asyncio.to_thread(self.source.reload, forced=forced)
        except FleetError as exc:  # the sources cannot be served together
            if self.fleet_error != str(exc) or forced:
                self.metrics.fleet_loads.labels("error").inc()
                event(
                    log,
                    logging.ERROR,
                    "fleet reload failed; keeping the current fleet",
                    error=str(exc),
                )
            self.fleet_error = str(exc)
            return
        # A broken source keeps serving its last good fleet and hides no other:
        # reported once per content (SIGHUP reports again), unready meanwhile.
        for error in result.new_errors:
            self.metrics.fleet_loads.labels("error").inc()
            event(
                log,
                logging.ERROR,
                "fleet reload failed; keeping the current fleet",
                error=str(error),
            )
        for source in result.recovered:
            event(log, logging.INFO, "fleet readable again", source=source)
        self.fleet_error = "; ".join(result.errors) or None
        fleet = result.fleet
        if fleet == self._fleet:
            self._fleet_retry = False
            if not result.errors:
                self.metrics.fleet_loads.labels("unchanged").inc()
            return
        if self.gateway is not None:
            self.gateway.fleet_changed(fleet)  # first, with no await between
        try:
            change = await self.book.apply_fleet(fleet)
        except StoreUnavailable:
            # The store could not take it (logged); the next poll tries again,
            # with the newest fleet then.
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


__all__ = ["MAINTENANCE_INTERVAL_S", "Service", "engine_factory", "make_backend"]
