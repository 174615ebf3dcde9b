"""One table from what the lease book (and the request parsing) raises to the
HTTP answer, used by the hot path (hotpath.py) and by Starlette's handlers
(app.py) alike: `{"error": code, "detail": text}` with its status."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from discovery.book.errors import (
    LeaseNotFound,
    NoProxyAvailable,
    StoreOverloaded,
    StoreUnavailable,
)

log = logging.getLogger("discovery.http")


class BadInput(Exception):
    """A request the API does not accept (400); the message says why."""


@dataclass(frozen=True)
class ErrorAnswer:
    status: int
    code: str
    detail: str
    headers: dict[str, str] = field(default_factory=dict)


def error_answer(exc: Exception) -> ErrorAnswer:
    """The answer to `exc`; anything unexpected is logged here with its
    traceback and answered 500 without a word of it."""
    match exc:
        case BadInput():
            return ErrorAnswer(400, "bad_request", str(exc))
        case LeaseNotFound():
            return ErrorAnswer(404, "lease_not_found", "no such lease, or it has ended")
        case NoProxyAvailable(detail=detail, retry_after=retry_after):
            return ErrorAnswer(409, "no_proxy_available", detail, {"Retry-After": str(retry_after)})
        case StoreOverloaded():  # load, not an outage: the same answer as a full server
            return ErrorAnswer(503, "overloaded", str(exc), {"Retry-After": "1"})
        case StoreUnavailable():
            return ErrorAnswer(503, "store_unavailable", str(exc), {"Retry-After": "1"})
    log.error("unhandled error", exc_info=exc)
    return ErrorAnswer(500, "internal_error", "internal error; see the service's log")


HANDLED = (BadInput, LeaseNotFound, NoProxyAvailable, StoreUnavailable)

__all__ = ["HANDLED", "BadInput", "ErrorAnswer", "error_answer"]
