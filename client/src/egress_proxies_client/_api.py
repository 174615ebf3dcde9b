"""The four lease calls, async, on one httpx.AsyncClient: what `alease()`,
`lease()` and the pool all send through (the JSON is _protocol.py's)."""

from __future__ import annotations

import httpx

from egress_proxies_client._options import token_or_env
from egress_proxies_client._protocol import (
    LEASES,
    TIMEOUT,
    Denied,
    Granted,
    Outcome,
    auth_headers,
    denied,
    ended_quietly,
    granted,
    renew_body,
    report_body,
)


class LeaseApi:
    """Calls the service at `base_url` with `token` (None: $DISCOVERY_TOKEN);
    `http` (an httpx.AsyncClient with its base URL set) replaces the client it
    would make (tests: an httpx.ASGITransport or MockTransport)."""

    def __init__(
        self, base_url: str, *, token: str | None, http: httpx.AsyncClient | None = None
    ) -> None:
        self.base_url = base_url
        self._token = token_or_env(token)
        self._http = http
        self._own = http is None

    def client(self) -> httpx.AsyncClient:
        # Made on first use: on the event loop that uses it.
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=auth_headers(self._token), timeout=TIMEOUT
            )
        return self._http

    async def grant(self, body: dict[str, object]) -> Granted | Denied:
        answer = await self.client().post(LEASES, json=body)
        return denied(answer) if answer.status_code == 409 else granted(answer)

    async def renew(self, lease_id: str, ttl: float | None = None) -> Granted | None:
        """The lease with its new end; None when it has ended (404)."""
        answer = await self.client().post(f"{LEASES}/{lease_id}/renew", json=renew_body(ttl))
        return None if answer.status_code == 404 else granted(answer)

    async def report(self, lease_id: str, outcome: Outcome, target: str | None) -> None:
        body = report_body(outcome, target)
        ended_quietly(await self.client().post(f"{LEASES}/{lease_id}/report", json=body))

    async def release(self, lease_id: str) -> None:
        ended_quietly(await self.client().delete(f"{LEASES}/{lease_id}"))

    async def aclose(self) -> None:
        if self._own and self._http is not None:
            await self._http.aclose()
            self._http = None
