"""What the operator watches while the autopilot runs (``--listen HOST:PORT``):
``GET /status`` (also ``/``) a small JSON document (paused, the last round,
changes held by the retry cap, a lock it waits for), ``GET /metrics`` the
Prometheus metrics below. A server of its own, not the discovery service's:
the autopilot runs where the stack's project is, the service anywhere.

Metrics (registry of this process):

- ``egress_autopilot_rounds_total{result}``: rounds by how they ended
  (``planned``, ``paused``, ``dry-run``, ``error``).
- ``egress_autopilot_changes_total{kind,result}``: changes (``recycle``,
  ``scale``) by result (``applied``, ``failed``, ``held``, ``capped``,
  ``dry-run``, ``paused``, ``lock-timeout``, ``stale-lock``).
- ``egress_autopilot_update_failures_total``: failed Pulumi updates.
- ``egress_autopilot_paused``: 1 while paused.
- ``egress_autopilot_capped_changes``: changes held now by the retry cap.
- ``egress_autopilot_waiting_for_lock``: 1 while it waits for another's lock.
- ``egress_autopilot_unhealthy_proxies``: proxies the service judged
  unhealthy at the last round (with ``recycle.unhealthyFor``; their spells'
  starts in the status document, ``unhealthySince``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Status:
    """The counters and the last state, updated by the round, read by the server."""

    def __init__(self, stack: str) -> None:
        self.registry = CollectorRegistry()
        self.rounds = Counter(
            "egress_autopilot_rounds",
            "Autopilot rounds by result",
            ["result"],
            registry=self.registry,
        )
        self.changes = Counter(
            "egress_autopilot_changes",
            "Autopilot changes by kind and result",
            ["kind", "result"],
            registry=self.registry,
        )
        self.failures = Counter(
            "egress_autopilot_update_failures", "Failed Pulumi updates", registry=self.registry
        )
        self.paused = Gauge("egress_autopilot_paused", "1 while paused", registry=self.registry)
        self.capped = Gauge(
            "egress_autopilot_capped_changes",
            "Changes held by the retry cap now",
            registry=self.registry,
        )
        self.waiting = Gauge(
            "egress_autopilot_waiting_for_lock",
            "1 while waiting for another operation's stack lock",
            registry=self.registry,
        )
        self.unhealthy = Gauge(
            "egress_autopilot_unhealthy_proxies",
            "Proxies judged unhealthy at the last round (with recycle.unhealthyFor)",
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._doc: dict[str, Any] = {
            "stack": stack,
            "paused": None,
            "lastRound": None,
            "capped": [],
            "waitingFor": None,
            "applying": None,  # the change whose update runs now, and since when
            "unhealthySince": {},
        }

    def set(self, **fields: Any) -> None:
        with self._lock:
            self._doc.update(fields)

    def document(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._doc, default=str))  # type: ignore[no-any-return]

    def metrics(self) -> bytes:
        return generate_latest(self.registry)


class _Handler(BaseHTTPRequestHandler):
    status: Status

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/status"):
            body = (json.dumps(self.status.document(), indent=1) + "\n").encode()
            kind = "application/json"
        elif path == "/metrics":
            body, kind = self.status.metrics(), CONTENT_TYPE_LATEST
        else:
            self.send_error(404, "only /status and /metrics")
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # the decision log is the autopilot's log; requests are not decisions


def serve(status: Status, host: str, port: int) -> ThreadingHTTPServer:
    """Serves STATUS on HOST:PORT in a daemon thread until shutdown()."""
    handler = type("StatusHandler", (_Handler,), {"status": status})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="autopilot-status", daemon=True).start()
    return server
