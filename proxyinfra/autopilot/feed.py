"""The discovery service's signals, fetched and converted into the planner's
:class:`~proxyinfra.autopilot.signals.Signals`: ``GET /v1/signals?window=S``
(docs/discovery.md, "Signals for the autopilot") with the bearer token of
``$DISCOVERY_TOKEN``, any replica.

A service that serves several stacks names proxies ``STACK/NAME`` and groups
``STACK/ENTRY``: only this stack's are kept, without the prefix; a service
serving this stack alone names them bare.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

import httpx

from proxyinfra.autopilot.changes import one_line
from proxyinfra.autopilot.signals import GroupSignal, ProxySignal, Signals


class SignalsError(Exception):
    """The service could not be asked, or answered what this cannot read."""


class SignalsSource(Protocol):
    def fetch(self, window_seconds: int) -> Mapping[str, Any]:
        """The service's answer (JSON) for WINDOW_SECONDS; SignalsError otherwise."""


class HttpSignals:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout

    def fetch(self, window_seconds: int) -> Mapping[str, Any]:
        where = f"{self.url}/v1/signals?window={window_seconds}"
        try:
            answer = httpx.get(
                f"{self.url}/v1/signals",
                params={"window": str(window_seconds)},
                headers=self._headers,
                timeout=self._timeout,
            )
        except httpx.HTTPError as error:
            raise SignalsError(f"GET {where}: {type(error).__name__}: {error}") from None
        if answer.status_code != 200:
            raise SignalsError(
                f"GET {where}: {answer.status_code} {one_line(answer.text[:200])}"
            ) from None
        try:
            body = answer.json()
        except ValueError:
            raise SignalsError(f"GET {where}: not JSON") from None
        if not isinstance(body, dict):
            raise SignalsError(f"GET {where}: not a JSON object")
        return body


def _time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise SignalsError(f"signals: {where}: not a time: {str(value)[:40]!r}") from None
    if parsed.tzinfo is None:
        raise SignalsError(f"signals: {where}: a time without its zone: {value!r}")
    return parsed


def _own(name: Any, stack: str) -> str | None:
    """NAME without this stack's prefix; None for another stack's."""
    if not isinstance(name, str):
        raise SignalsError(f"signals: a name that is no string: {name!r}")
    qualifier, slash, bare = name.partition("/")
    if not slash:
        return name
    return bare if qualifier == stack else None


def signals_from_answer(answer: Mapping[str, Any], stack: str) -> Signals:
    """The planner's Signals from the service's answer."""
    try:
        at = _time(answer["now"], "now")
        window = timedelta(seconds=int(answer["windowSeconds"]))
        proxies: dict[str, ProxySignal] = {}
        for entry in answer["proxies"]:
            name = _own(entry["name"], stack)
            if name is None:
                continue
            proxies[name] = ProxySignal(
                healthy=entry["health"] == "healthy",
                unhealthy=entry["health"] == "unhealthy",
                blocked_sites=int(entry["blockedSites"]),
                last_blocked_at=_time(entry.get("lastBlockedAt"), f"proxies[{name}].lastBlockedAt"),
            )
        groups: dict[str, GroupSignal] = {}
        for entry in answer["groups"]:
            name = _own(entry["name"], stack)
            if name is None:
                continue
            groups[name] = GroupSignal(refused=int(entry["refused"]), leased=int(entry["leased"]))
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, SignalsError):
            raise
        raise SignalsError(f"signals: not the answer of GET /v1/signals ({error!r})") from None
    if at is None:
        raise SignalsError("signals: now is null")
    return Signals(at=at, window=window, proxies=proxies, groups=groups)
