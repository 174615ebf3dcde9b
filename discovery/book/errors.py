"""What a lease-book operation raises, whatever the store: each maps to one
HTTP answer (discovery/http_errors.py)."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be opened or written (its own words, for the log)."""


class LeaseNotFound(Exception):
    """No such lease, or it has ended (released, expired, proxy left the fleet)."""


class StoreUnavailable(Exception):
    """The change could not be made durable, so it was not made. The message
    goes to clients: it never names the database."""


class StoreOverloaded(StoreUnavailable):
    """The store is reachable but too busy to take the change now (every
    connection to it in use): load, not an outage. Nothing was changed."""


class NoProxyAvailable(Exception):
    def __init__(self, reason: str, retry_after: int, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.retry_after = retry_after
        self.detail = detail


__all__ = [
    "LeaseNotFound",
    "NoProxyAvailable",
    "StoreError",
    "StoreOverloaded",
    "StoreUnavailable",
]
