"""Structured logs: one JSON object per line on stderr.

Every line has ``ts``, ``level``, ``logger`` and ``event``; the fields given
with :func:`event` follow. The level comes from ``EGRESS_PROXIES_LOG`` like
the rest of the project (``info`` by default, ``debug`` adds one line per
lease operation and per HTTP request).

What never reaches a log line: the bearer token (it is also scrubbed from
every formatted line, in case a library ever echoes a header) and proxy
credentials (the service logs proxy names, never URLs).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from proxyinfra.logs import level_from_env

_FIELDS = "discovery_fields"
_LOGGERS = ("discovery", "health", "uvicorn", "uvicorn.error")
_REDACTED = "[redacted]"


def event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    """Log the event `name` with structured `fields` (cheap when the level is off)."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra={_FIELDS: fields})


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        # Only long secrets are scrubbed: replacing a 1-character "token"
        # everywhere would make every line unreadable and protect nothing.
        self._secrets = tuple(s for s in secrets if len(s) >= 4)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, _FIELDS, None)
        if fields:
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        text = json.dumps(line, default=str, ensure_ascii=False)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        return text


def configure(*, secrets: tuple[str, ...] = (), stream: Any = None) -> None:
    """Route the service's, the health engine's and uvicorn's loggers to stderr as JSON."""
    level = level_from_env()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(secrets))
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    # uvicorn's access log would log every request at info; ours is at debug.
    logging.getLogger("uvicorn.access").disabled = True
