"""Each replica's own connection to the database, outside the pool: it says
whether the database can be reached, and holds the replica's probing slot
(sharing.py), by which the live replicas share the fleet's probing.

Reachability (readiness): a statement on this connection every round (at
most a second apart), answered within CHECK_TIMEOUT_S, or the database is
unreachable (`PostgresStore.failure`) until one is answered again. Not the
pool's: a busy replica's requests fill its pool while the database answers
at once, and that is load (store.py), not an outage.

Probing: every replica takes a probing slot (a session advisory lock) on
this connection, and its round's statement is the read of the live slots
(pg_locks). The proxies shared are its own fleet and the proxies only other
replicas' fleets hold (read from the database, which holds how to reach
them: fleets.py), so every proxy any replica serves has a prober. The
replica's engine is given its share alone (sharing.share): a proxy new to it
is probed at once, the rest keep their schedule. It writes what its engine
sees of its share into the proxies' rows, which every replica reads for
grants and `GET /v1/proxies`, and hands crawlers' `error` reports on its
share (each one) to its engine; that work runs on a second connection of
its own (prober_statements.py), so neither a busy pool nor a slow write
delays the check. When a replica dies, PostgreSQL drops its connection and
its slot with it; the others see it at their next read (FLUSH_S) and probe
its proxies from then on. A replica that loses its connection stops probing
until it holds a slot again.

The Prober is this replica's part in all of that; the book holds it (book.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import psycopg

from discovery.book.errors import StoreError
from discovery.book.rules import round_latency
from discovery.health_source import HealthSource
from discovery.logs import event
from discovery.postgres import prober_statements, sharing
from discovery.postgres.rows import HealthView
from discovery.postgres.store import PostgresStore
from health.model import Health, ProxyEndpoint

log = logging.getLogger("discovery.shared")

FLUSH_S = 1.0  # how often a replica reads the live slots, writes health, reads error reports
CHECK_TIMEOUT_S = 5.0  # a check unanswered this long: the database is unreachable
NAMES_LOGGED = 20  # proxies named in a log line, of however many

T = TypeVar("T")


def _named(names: Iterable[str]) -> str:
    ordered = sorted(names)
    more = ", ..." if len(ordered) > NAMES_LOGGED else ""
    return ", ".join(ordered[:NAMES_LOGGED]) + more


class Prober:
    def __init__(
        self, store: PostgresStore, engine: HealthSource, *, probe_interval: float
    ) -> None:
        self._store = store
        self._engine = engine
        self._retry = max(0.2, min(1.0, probe_interval / 2))
        self._written: dict[str, HealthView] = {}
        self._own: dict[str, ProxyEndpoint] = {}  # this replica's fleet
        self._foreign: dict[str, ProxyEndpoint] = {}  # only other fleets'
        self._slot: int | None = None  # this replica's probing slot, while it holds one
        self._slots: list[int] = []  # the live slots, as last read
        self._share: set[str] = set()  # the proxies this replica probes
        self._probed: list[ProxyEndpoint] | None = None  # what the engine was last given
        self._said: tuple[list[int], set[str]] | None = None  # the last share logged
        self._work: psycopg.AsyncConnection[Any] | None = None
        self._syncing = asyncio.Lock()  # one round at a time on the work connection
        self._work_error: str | None = None
        self._whole = True  # the next flush reads the whole share, not only what changed
        self._no_slot_said = False

    @property
    def probing(self) -> bool:
        """Whether this replica holds a probing slot (and probes its share)."""
        return self._slot is not None

    @property
    def share(self) -> frozenset[str]:
        return frozenset(self._share)

    # -- what the engine probes ------------------------------------------------------------

    def serve(self, endpoints: Iterable[ProxyEndpoint]) -> None:
        """This replica's fleet (the book's, at start and at each change)."""
        self._own = {e.name: e for e in endpoints}
        self._push()

    def _push(self) -> None:
        """Gives the engine this replica's share of every proxy a replica serves;
        called when the fleet, the foreign proxies or the live slots change
        (the split holds the loop about 0.1 s at 50,000 proxies)."""
        everyone = {**self._foreign, **self._own}
        if self._slot is None:
            mine: set[str] = set()
        else:
            mine = sharing.share(everyone, self._slot, self._slots)
        probed = [e for name, e in everyone.items() if name in mine]
        if probed != self._probed:
            self._engine.set_fleet(probed)
            self._probed = probed
        if mine != self._share:
            # What this replica wrote of a proxy it no longer probes is another's now.
            self._written = {n: v for n, v in self._written.items() if n in mine}
        self._share = mine
        if self._slot is not None and self._said != (self._slots, mine):
            self._said = (self._slots, mine)
            event(
                log,
                logging.INFO,
                "probing a share of the fleet",
                slot=self._slot,
                slots=", ".join(map(str, self._slots)),
                count=len(mine),
                fleet=len(everyone),
                proxies=_named(mine),
            )

    # -- the replica's own connection: reachability and the slot ---------------------------

    async def run(self) -> None:
        """Checks the database every round: takes a slot, then reads the live
        slots; probes its share while it holds one; reconnects when the
        connection fails; forever (cancelled at stop)."""
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self._store.connect_alone()
                await self._watch(conn)
            except (StoreError, psycopg.Error) as error:
                self._store.failure = str(error).splitlines()[0] if str(error) else "no answer"
                event(log, logging.WARNING, "database not reachable", error=str(error))
            finally:
                await self._stop_probing()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(self._retry)

    async def _watch(self, conn: psycopg.AsyncConnection[Any]) -> None:
        work: asyncio.Task[None] | None = None
        try:
            while True:
                await self.step(conn)
                if self._slot is not None and work is None:
                    work = asyncio.get_running_loop().create_task(self._work_rounds())
                await asyncio.sleep(FLUSH_S if self._slot is not None else self._retry)
        finally:
            if work is not None:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work

    async def step(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """One round on the slot's connection `conn`: take a slot if this
        replica holds none, then read the live slots and share again if they
        changed. The check of reachability, too."""
        if self._slot is None:
            slot = await self._ask(sharing.take_slot(conn))
            if slot is None:
                if not self._no_slot_said:
                    event(
                        log,
                        logging.WARNING,
                        "not probing: every probing slot is taken",
                        slots=sharing.MAX_SLOTS,
                    )
                    self._no_slot_said = True
                return
            self._no_slot_said = False
            self._slot = slot
            self._written = {}
            self._whole = True
            await self._engine.start()
        slots = await self._ask(sharing.live_slots(conn))
        if self._slot not in slots:
            raise StoreError(f"probing slot {self._slot} lost")  # cannot be, on this session
        if slots != self._slots:
            self._slots = slots
            self._push()

    async def _ask(self, statement: Awaitable[T]) -> T:
        """One check: `statement`'s answer, within CHECK_TIMEOUT_S. The
        database counts as reachable from then on."""
        task = asyncio.ensure_future(statement)
        done, _ = await asyncio.wait({task}, timeout=CHECK_TIMEOUT_S)
        if not done:
            # Unreachable now, not once psycopg's cancellation gives up (up to 10 s more).
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            task.cancel()
            raise StoreError(f"no answer from the database in {CHECK_TIMEOUT_S:g} s")
        answer = task.result()
        self._store.failure = None
        return answer

    async def _stop_probing(self) -> None:
        if self._slot is None:
            return
        slot, self._slot = self._slot, None
        self._slots = []
        self._said = None
        self._push()
        await self._engine.stop()
        await self._close_work()
        event(log, logging.INFO, "stopped probing (the probing slot is lost)", slot=slot)

    # -- the replica's work on its share, on a second connection ---------------------------

    async def _work_rounds(self) -> None:
        while True:
            try:
                await self.sync()
                if self._work_error is not None:
                    event(log, logging.INFO, "the prober's writes go through again")
                    self._work_error = None
            except StoreError as error:
                # Logged once per reason: the check says whether the database is there.
                if str(error) != self._work_error:
                    event(log, logging.WARNING, "the prober's writes failed", error=str(error))
                    self._work_error = str(error)
            await asyncio.sleep(FLUSH_S)

    async def sync(self) -> None:
        """One round of the prober's work: the proxies only other fleets hold
        in, its share's health changes out, its share's error reports in."""
        async with self._syncing:
            await self._sync()

    async def _sync(self) -> None:
        try:
            if self._work is None or self._work.closed:
                self._work = await self._store.connect_alone()
            conn = self._work
            await self._refresh_foreign(conn)
            await self._flush(conn)
            for row in await prober_statements.take_error_reports(conn, self._share):
                for _ in range(row.count):
                    self._engine.report_error(row.proxy, row.error)
        except psycopg.Error as error:
            self._whole = True  # what changed and was not written: read it all again
            await self._close_work()
            raise StoreError(str(error).splitlines()[0] if str(error) else "failed") from None

    async def close(self) -> None:
        await self._close_work()

    async def _close_work(self) -> None:
        conn, self._work = self._work, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _refresh_foreign(self, conn: psycopg.AsyncConnection[Any]) -> None:
        rows = await prober_statements.foreign_proxies(self._store, conn)
        foreign = {
            r.name: ProxyEndpoint(r.name, r.host, r.port, r.username, r.password)
            for r in rows
            if r.name not in self._own
        }
        if foreign == self._foreign:
            return
        if foreign.keys() != self._foreign.keys():
            event(
                log,
                logging.INFO,
                "probing proxies that only other replicas serve",
                count=len(foreign),
                proxies=_named(foreign),
            )
        self._foreign = foreign
        self._push()

    async def _flush(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Writes every proxy of the share whose view changed since the last
        flush. A proxy not probed yet (new to the share) keeps what its last
        prober wrote. The health engine says which proxies it probed since
        the last round (HealthEngine.take_changed; a tenth of the share at
        each round, with the defaults): the whole share read every second
        cost a tenth of a core at 25,000 proxies."""
        rows: list[tuple[str, HealthView]] = []
        written = self._written
        mine = self._share
        probed = self._engine.take_changed()
        states = self._engine.all() if self._whole else probed
        self._whole = False
        for state in states:
            if state.health == Health.UNKNOWN or state.name not in mine:
                continue
            view = HealthView(
                str(state.health),
                round_latency(state.latency_ms),
                state.last_error,
                state.recent_ms,
            )
            if written.get(state.name) != view:
                rows.append((state.name, view))
        changed = sum(
            1 for name, view in rows if name not in written or written[name].health != view.health
        )
        await prober_statements.write_health(conn, rows, health_changes=changed)
        written.update(rows)


__all__ = ["CHECK_TIMEOUT_S", "FLUSH_S", "NAMES_LOGGED", "Prober"]
