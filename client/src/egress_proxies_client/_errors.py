"""What the client raises."""

from __future__ import annotations


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


class PoolClosed(RuntimeError):
    """The pool was closed: no more leases."""
