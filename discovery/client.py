"""A small client for crawlers.

    from discovery.client import lease

    with lease("http://127.0.0.1:8080", holder="crawler-7", target="https://example.com/") as proxy:
        answer = httpx.get("https://example.com/", proxy=proxy.url)
        if answer.status_code == 403:
            proxy.report("blocked")          # cooldown of this proxy for example.com

`lease()` waits while nothing is free (the service's 409), sleeping what its
Retry-After says, up to `wait` seconds; renews the lease in a background
thread at a third of its TTL; and releases it when the block ends, also on
an exception. The token defaults to $DISCOVERY_TOKEN.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx

Outcome = Literal["ok", "blocked", "error"]
_TIMEOUT = httpx.Timeout(10.0)


class DiscoveryError(Exception):
    """The service answered with an error (`error` and `detail` from its JSON)."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class NoProxyAvailable(DiscoveryError):
    """Still 409 when `wait` ran out; `retry_after` is the service's last estimate."""

    def __init__(self, detail: str, retry_after: float) -> None:
        super().__init__(409, "no_proxy_available", detail)
        self.retry_after = retry_after


def _raise_for(answer: httpx.Response) -> None:
    if answer.is_success:
        return
    try:
        body = answer.json()
        error, detail = str(body["error"]), str(body["detail"])
    except (ValueError, KeyError, TypeError):
        error, detail = "http_error", answer.text[:200]
    raise DiscoveryError(answer.status_code, error, detail)


@dataclass
class Lease:
    """A granted lease. `url` carries the proxy's credentials: do not log it."""

    id: str
    holder: str
    name: str
    url: str = field(repr=False)
    expires_at: datetime
    target: str | None
    _http: httpx.Client = field(repr=False)
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def lost(self) -> bool:
        """True once the service said the lease is gone (expired, or its proxy left the fleet)."""
        return self._lost.is_set()

    def report(self, outcome: Outcome, target: str | None = None) -> None:
        """Tells the service how the proxy did; `target` defaults to the lease's."""
        body: dict[str, Any] = {"outcome": outcome}
        if (target or self.target) is not None:
            body["target"] = target or self.target
        _raise_for(self._http.post(f"/v1/leases/{self.id}/report", json=body))

    def renew(self, ttl: float | None = None) -> None:
        body = {"ttlSeconds": ttl} if ttl is not None else None
        answer = self._http.post(f"/v1/leases/{self.id}/renew", json=body)
        if answer.status_code == 404:
            self._lost.set()
        _raise_for(answer)
        self._update(answer.json())

    def _update(self, data: Mapping[str, Any]) -> None:
        self.url = data["proxy"]["url"]  # the proxy may have moved
        self.expires_at = datetime.fromisoformat(data["expiresAt"].replace("Z", "+00:00"))

    def _seconds_left(self) -> float:
        return self.expires_at.timestamp() - time.time()


def _grant(http: httpx.Client, body: Mapping[str, Any], wait: float, sleep: Any) -> httpx.Response:
    deadline = time.monotonic() + wait
    while True:
        answer = http.post("/v1/leases", json=body)
        if answer.status_code != 409:
            _raise_for(answer)
            return answer
        try:
            retry_after = max(0.1, float(answer.headers.get("retry-after", "1")))
        except ValueError:
            retry_after = 1.0
        left = deadline - time.monotonic()
        if left <= 0:
            detail = answer.json().get("detail", "") if answer.content else ""
            raise NoProxyAvailable(str(detail), retry_after)
        # A little jitter, so crawlers told the same Retry-After do not all return at once.
        sleep(min(left, retry_after * (1 + 0.1 * random.random())))


def _renew_loop(handle: Lease, stop: threading.Event) -> None:
    while True:
        # A third of what is left: two more chances before it runs out.
        if stop.wait(max(0.2, handle._seconds_left() / 3)):
            return
        try:
            handle.renew()
        except DiscoveryError:
            if handle.lost:
                return
        except httpx.TransportError:
            if handle._seconds_left() <= 0:
                handle._lost.set()
                return


def _release(
    handle: Lease,
    http: httpx.Client,
    stop: threading.Event,
    renewer: threading.Thread | None,
    *,
    quiet: bool,
) -> None:
    stop.set()
    if renewer is not None:
        renewer.join()
    try:
        answer = http.delete(f"/v1/leases/{handle.id}")
        if answer.status_code != 404:  # 404: it ended already (expired, revoked)
            _raise_for(answer)
    except (DiscoveryError, httpx.HTTPError):
        if not quiet:
            raise


@contextmanager
def lease(
    base_url: str,
    holder: str,
    *,
    target: str | None = None,
    ttl: float | None = None,
    provider: str | None = None,
    zone: str | None = None,
    labels: Mapping[str, str] | None = None,
    token: str | None = None,
    wait: float = 300.0,
    renew: bool = True,
    http: httpx.Client | None = None,
) -> Iterator[Lease]:
    """Holds a lease for the duration of the `with` block (see the module's doc)."""
    token = token if token is not None else os.environ.get("DISCOVERY_TOKEN")
    own = http is None
    if http is None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        http = httpx.Client(base_url=base_url, headers=headers, timeout=_TIMEOUT)
    try:
        body: dict[str, Any] = {"holder": holder}
        if ttl is not None:
            body["ttlSeconds"] = ttl
        if target is not None:
            body["target"] = target
        selector = {
            k: v
            for k, v in (("provider", provider), ("zone", zone), ("labels", labels))
            if v is not None
        }
        if selector:
            body["selector"] = selector
        data = _grant(http, body, wait, time.sleep).json()
        handle = Lease(
            data["id"], data["holder"], data["proxy"]["name"], "", datetime.now(), target, http
        )
        handle._update(data)
        stop = threading.Event()
        renewer = None
        if renew:
            renewer = threading.Thread(
                target=_renew_loop, args=(handle, stop), name=f"lease-{handle.id[:8]}", daemon=True
            )
            renewer.start()
        try:
            yield handle
        except BaseException:
            # The block's own exception is what the caller must see, not a failed release.
            _release(handle, http, stop, renewer, quiet=True)
            raise
        _release(handle, http, stop, renewer, quiet=False)
    finally:
        if own:
            http.close()
