"""Log levels for the provider process and the CLIs, set by one environment
variable so the engine's dynamic-provider process honours it too.

``EGRESS_PROXIES_LOG``: ``info`` (default), ``debug`` (one line per libvirt
RPC, connection events), ``2`` or ``trace`` (adds domain and volume XML,
metadata, interface addresses, listing names). Cloud-init content is never
logged at any level. ``EGRESS_PROXIES_LOG_FILE`` also appends to a file.
"""

from __future__ import annotations

import logging
import os
import sys

ENV_LEVEL = "EGRESS_PROXIES_LOG"
ENV_FILE = "EGRESS_PROXIES_LOG_FILE"
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

_LEVELS = {"info": logging.INFO, "debug": logging.DEBUG, "2": TRACE, "trace": TRACE}
_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_configured = False


def level_from_env() -> int:
    value = os.environ.get(ENV_LEVEL, "info").strip().lower()
    if value in _LEVELS:
        return _LEVELS[value]
    if value in ("warning", "error"):
        return logging.getLevelName(value.upper())  # type: ignore[no-any-return]
    raise ValueError(f"{ENV_LEVEL}={value!r}: use info, debug or 2 (trace)")


def configure() -> None:
    """Idempotent: called at the start of every provider method and CLI."""
    global _configured
    if _configured:
        return
    _configured = True
    level = level_from_env()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if path := os.environ.get(ENV_FILE):
        handlers.append(logging.FileHandler(path))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(_FORMAT))
    for name in ("kvm", "proxyinfra", "health"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        for handler in handlers:
            logger.addHandler(handler)
        logger.propagate = False
