"""The gateway: its listener, its connections and tunnels, the leases it
holds and its upkeep (docs/gateway.md); the connections themselves are
server.py's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from discovery.book.contract import LeaseBook, Outcome
from discovery.brake import Brake
from discovery.fleet import Fleet
from discovery.gateway.bans import BanPolicy
from discovery.gateway.holds import Holds
from discovery.gateway.identity import Admission
from discovery.gateway.metrics import GatewayMetrics
from discovery.gateway.relay import Tunnel
from discovery.gateway.server import ClientConnection
from discovery.logs import event
from discovery.settings import GatewaySettings

log = logging.getLogger("discovery.gateway")

UPKEEP_S = 1.0


class Gateway:
    """The listener, its connections and tunnels, and the leases it holds."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        book: Callable[[], LeaseBook],
        token: str | None,
        brake: Brake,
        registry: CollectorRegistry,
        policy: BanPolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.admission = Admission(token, brake, settings.allow)
        self.holds = Holds(
            book,
            per_site=settings.per_site,
            idle_release=settings.idle_release,
            holder_leases=settings.holder_leases,
            clock=clock,
        )
        self.policy = policy or BanPolicy()
        self.connections: set[ClientConnection] = set()
        self.tunnels: set[Tunnel] = set()
        self.holder_tunnels: Counter[str] = Counter()
        self.metrics = GatewayMetrics(registry, lambda: len(self.tunnels))
        self._server: asyncio.Server | None = None
        self._upkeep: asyncio.Task[None] | None = None

    @property
    def max_connections(self) -> int:
        # Tunnels, plus as many connections again waiting for or sending a request.
        return 2 * self.settings.max_tunnels

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self),
            self.settings.host,
            self.settings.port,
            backlog=4096,
            reuse_address=True,
        )
        self._upkeep = loop.create_task(self._keep_up())
        event(log, logging.INFO, "gateway listening", listen=f"{self.settings.host}:{self.port}")

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self.settings.port
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._upkeep is not None:
            self._upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._upkeep
        for tunnel in list(self.tunnels):
            tunnel.close()
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)  # the handlers' finally clauses run
        await self.holds.close()

    async def _keep_up(self) -> None:
        while True:
            await asyncio.sleep(UPKEEP_S)
            try:
                await self.holds.tick()
                for tunnel in list(self.tunnels):
                    if tunnel.idle_for() >= self.settings.tunnel_idle:
                        tunnel.close()
            except Exception:
                log.exception("gateway upkeep failed; trying again")

    def fleet_changed(self, fleet: Fleet) -> None:
        """The service read a new fleet and is about to switch its book to it
        (called before, with no await between, so that no request goes to a
        departed proxy once the book has ended its leases): sessions and site
        sets leave the proxies it lacks (Holds.fleet_changed)."""
        left = self.holds.fleet_changed(fleet.proxies)
        if left:
            event(
                log,
                logging.INFO,
                "gateway leaves departed proxies",
                proxies=sorted({hold.proxy for hold in left}),
                holds=len(left),
                tunnels=sum(len(hold.closers) for hold in left),
            )

    async def report(self, holder: str, session: str, outcome: Outcome, site: str | None) -> bool:
        """A report on a session's proxy through the API (tunnels the gateway
        cannot see into); False when the session holds no lease here."""
        holds = self.holds.session(holder, session)
        for hold in holds:
            await self.holds.report(hold, outcome, site)
        return bool(holds)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per proxy, for the status page: who holds it through the gateway, and
        the bytes it moved for gateway clients since the service started."""
        shown: dict[str, dict[str, Any]] = {}
        for proxy in set(self.metrics.proxy_up) | set(self.metrics.proxy_down):
            shown[proxy] = {
                "holder": None,
                "bytesUp": self.metrics.proxy_up[proxy],
                "bytesDown": self.metrics.proxy_down[proxy],
            }
        for hold in self.holds.every():
            entry = shown.setdefault(hold.proxy, {"bytesUp": 0, "bytesDown": 0})
            entry["holder"] = hold.identity.describe()
        return shown


__all__ = ["UPKEEP_S", "Gateway"]
