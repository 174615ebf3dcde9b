"""The garbage collector's settings for a long-running service.

CPython's cyclic collector runs a full (oldest-generation) pass every so
often, and a full pass walks every tracked object: with a fleet of 10,000
proxies, the lease book's and the health engine's state for it, the app and
its imported modules, that is a pause of 25-40 ms in the middle of serving.
It set the p99 latency of the open-loop benchmark (bench/discovery_leases.py).
What is alive once the service has started (and again once a new fleet is
in place) stays alive, so it is frozen (moved out of the collector's sight),
and young collections are made rarer: a request allocates a few hundred
short-lived objects, nearly all freed by reference counting anyway.
"""

from __future__ import annotations

import gc

# Objects allocated (net) before a young collection; CPython's default is 700.
YOUNG_THRESHOLD = 50_000
OLDER_THRESHOLDS = (50, 100)


def settle() -> None:
    """Call once the long-lived state is built (the service started, a new
    fleet applied): collects what is garbage, then freezes the rest. Only
    what was built since the last call is walked."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


__all__ = ["settle"]
