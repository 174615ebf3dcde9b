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
from typing import Any

from prometheus_client import CollectorRegistry

from discovery.fleet import Fleet, FleetError, FleetSource
from discovery.health_source import HealthFactory, HealthSource
from discovery.leases import LeaseBook
from discovery.logs import event
from discovery.metrics import Metrics
from discovery.settings import Settings
from discovery.store import LeaseStore, Prune, StoredState
from health.model import Health, HealthListener

log = logging.getLogger("discovery")

REPORT_RETENTION_S = 7 * 24 * 3600.0
MAINTENANCE_INTERVAL_S = 30.0
_EXPIRY_TICK_S = 0.25  # longest a lease outlives its expiry before it is swept


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
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.store = LeaseStore(settings.db)
        self.store.on_commit = self.metrics.on_commit
        self.source = FleetSource(path=settings.fleet_file, stack=settings.stack)
        self._health_factory = health_factory or engine_factory(settings)
        self._clock = clock
        self._state: StoredState | None = None
        self._fleet: Fleet | None = None
        self._health: HealthSource | None = None
        self._book: LeaseBook | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reload = asyncio.Event()
        self._sighup = False
        self.ready = False

    @property
    def book(self) -> LeaseBook:
        if self._book is None:
            raise RuntimeError("the service has not started")
        return self._book

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
        ]
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True
        self.ready = True
        event(log, logging.INFO, "service started")

    async def stop(self) -> None:
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
        # close() waits for the writer thread to commit what is queued.
        await asyncio.to_thread(self.store.close)
        event(log, logging.INFO, "service stopped")

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
            if forced or self.source.changed():
                await self._reload_fleet()

    async def _reload_fleet(self) -> None:
        try:
            fleet = await asyncio.to_thread(self.source.load)
        except FleetError as exc:
            # Keep serving the fleet we have: a broken file must not end leases.
            self.metrics.fleet_loads.labels("error").inc()
            event(
                log, logging.ERROR, "fleet reload failed; keeping the current fleet", error=str(exc)
            )
            return
        if fleet == self._fleet:
            self.metrics.fleet_loads.labels("unchanged").inc()
            return
        self._fleet = fleet
        change = await self.book.apply_fleet(fleet)
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
            book.prune_cooldowns()
            book.resync_pool()
            await self.store.write((Prune(now, now - REPORT_RETENTION_S),))
