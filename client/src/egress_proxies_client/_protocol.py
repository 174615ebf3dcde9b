"""The lease API's requests and answers, without I/O: what every caller (the
lease context managers, the pool) sends and how it reads the answer. The
one place that knows the service's JSON."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx

from egress_proxies_client._errors import DiscoveryError

Outcome = Literal["ok", "blocked", "error"]
LEASES = "/v1/leases"
TIMEOUT = httpx.Timeout(10.0)


def selector(
    provider: str | None = None, zone: str | None = None, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The grant's selector: only the fields given."""
    given = {"provider": provider, "zone": zone, "labels": dict(labels) if labels else None}
    return {key: value for key, value in given.items() if value is not None}


def grant_body(
    holder: str, *, target: str | None, ttl: float | None, chosen: Mapping[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {"holder": holder}
    if ttl is not None:
        body["ttlSeconds"] = ttl
    if target is not None:
        body["target"] = target
    if chosen:
        body["selector"] = dict(chosen)
    return body


def report_body(outcome: Outcome, target: str | None) -> dict[str, Any]:
    return {"outcome": outcome} | ({"target": target} if target is not None else {})


def renew_body(ttl: float | None) -> dict[str, Any]:
    return {"ttlSeconds": ttl} if ttl is not None else {}


def raise_for(answer: httpx.Response) -> None:
    """DiscoveryError for an error answer (its `error` and `detail`)."""
    if answer.is_success:
        return
    try:
        body = answer.json()
        error, detail = str(body["error"]), str(body["detail"])
    except (ValueError, KeyError, TypeError):
        error, detail = "http_error", answer.text[:200]
    raise DiscoveryError(answer.status_code, error, detail)


def ended_quietly(answer: httpx.Response) -> None:
    """A release or report answer: a 404 means the lease ended already (it
    expired, or its proxy left the fleet), which is what the caller wanted."""
    if answer.status_code != 404:
        raise_for(answer)


@dataclass(frozen=True)
class Denied:
    """A 409: nothing eligible now; when to ask again and why."""

    retry_after: float
    detail: str

    def pause(self, rng: random.Random | None = None) -> float:
        """Retry-After with a little jitter, so crawlers told the same do not
        all come back at once."""
        return self.retry_after * (1 + 0.1 * (rng or random).random())


def denied(answer: httpx.Response) -> Denied:
    try:
        retry_after = max(0.1, float(answer.headers.get("retry-after", "1")))
    except ValueError:
        retry_after = 1.0
    detail = ""
    with contextlib.suppress(ValueError, AttributeError):
        detail = str(answer.json().get("detail", ""))
    return Denied(retry_after, detail)


@dataclass
class Granted:
    """A lease as the service describes it. `url` carries the proxy's
    credentials: never log it."""

    id: str
    holder: str
    name: str
    url: str = field(repr=False)
    expires_at: float  # epoch seconds


def granted(answer: httpx.Response) -> Granted:
    """The lease of a 201 or 200 answer; DiscoveryError for any error."""
    raise_for(answer)
    data = answer.json()
    return Granted(
        data["id"],
        data["holder"],
        data["proxy"]["name"],
        data["proxy"]["url"],
        epoch(data["expiresAt"]),
    )


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}
