"""A GCE metadata server on 127.0.0.1, as much of it as a proxy VM uses.

GCP itself cannot be reached from the build machines, so this answers the
way Compute Engine's metadata server is documented to:

- `GET /computeMetadata/v1/instance/attributes/KEY` with the header
  `Metadata-Flavor: Google` (403 without it): the value and an `ETag`
  header; 404 for a key the instance does not have;
- `?wait_for_change=true&last_etag=E&timeout_sec=N`: answers at once when
  the value's ETag differs from E, else holds the request until it does or
  N seconds pass, then answers with the value it has;
- `PUT /computeMetadata/v1/instance/guest-attributes/NAMESPACE/KEY`: stored
  when the metadata has `enable-guest-attributes: TRUE`, else 403;
- what cloud-init's GCE datasource reads besides: `instance/id`,
  `instance/zone`, `instance/hostname`, and `instance/attributes/` and
  `project/attributes/` with `?recursive=True` (every key, as a JSON object).

Metadata is replaced whole, as `instances.setMetadata` does. A test may
`hold` the plain reads of a key (not the waits), or the writes of a guest
attribute, to change the metadata at a point of the guest's work it chooses.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"
GUEST_ATTRIBUTES = "/computeMetadata/v1/instance/guest-attributes/"
PROJECT_ATTRIBUTES = "/computeMetadata/v1/project/attributes/"
INSTANCE = {
    "/computeMetadata/v1/instance/id": "4520031799277581759",
    "/computeMetadata/v1/instance/zone": "projects/123456789012/zones/europe-west1-b",
    "/computeMetadata/v1/instance/hostname": "proxy.europe-west1-b.c.crawl.internal",
}
_MAX_WAIT_S = 3600.0


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class MetadataServer:
    """The server, in a thread; `host` is what GCE_METADATA_HOST takes."""

    def __init__(self, metadata: dict[str, str] | None = None) -> None:
        self._metadata = dict(metadata or {})
        self._changed = threading.Condition()
        self.guest_attributes: dict[str, str] = {}
        self._holds: dict[str, tuple[threading.Event, threading.Event]] = {}
        self._parked: dict[str, int] = {}  # long polls waiting on a key's change now
        self._closing = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def set(self, metadata: dict[str, str]) -> None:
        """Replace the instance's metadata, waking the requests that wait on it."""
        with self._changed:
            self._metadata = dict(metadata)
            self._changed.notify_all()

    def hold(self, name: str) -> None:
        """Plain reads of the key NAME, or writes of the guest attribute NAME
        (`namespace/key`), wait from now on, until `release`."""
        with self._changed:
            self._holds[name] = (threading.Event(), threading.Event())

    def held(self, name: str, timeout: float) -> bool:
        """Whether a request for NAME came and is waiting (within TIMEOUT)."""
        return self._holds[name][0].wait(timeout)

    def release(self, name: str) -> None:
        """The held requests for NAME go on, on the metadata as it is then."""
        with self._changed:
            _, go = self._holds.pop(name)
        go.set()

    def _wait_if_held(self, name: str) -> None:
        with self._changed:
            hold = self._holds.get(name)
        if hold is not None:
            came, go = hold
            came.set()
            go.wait(60)

    def parked(self, name: str) -> bool:
        """Whether a long poll on key NAME waits for its change now: the agent
        is between applies, not in one."""
        with self._changed:
            return self._parked.get(name, 0) > 0

    def guest_attribute(self, name: str) -> str | None:
        with self._changed:
            return self.guest_attributes.get(name)

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            holds, self._holds = list(self._holds.values()), {}
        for _, go in holds:
            go.set()
        self._server.shutdown()
        self._server.server_close()

    def _get(self, key: str, query: dict[str, list[str]]) -> str | None:
        waits = query.get("wait_for_change", [""])[0] == "true"
        last = query.get("last_etag", [""])[0]
        timeout = min(float(query.get("timeout_sec", [_MAX_WAIT_S])[0]), _MAX_WAIT_S)
        if not waits:
            self._wait_if_held(key)
        with self._changed:
            if waits:
                parked = etag(self._metadata.get(key, "")) == last
                self._parked[key] = self._parked.get(key, 0) + parked
                try:
                    self._changed.wait_for(
                        lambda: self._closing or etag(self._metadata.get(key, "")) != last, timeout
                    )
                finally:
                    self._parked[key] -= parked
            return self._metadata.get(key)

    def _all(self) -> str:
        with self._changed:
            return json.dumps(self._metadata)

    def _put(self, name: str, value: str) -> bool:
        self._wait_if_held(name)
        with self._changed:
            if self._metadata.get("enable-guest-attributes") != "TRUE":
                return False
            self.guest_attributes[name] = value
            return True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: str = "", tag: str | None = None) -> None:
                # OSError: the client went away (a guest closed while it waited).
                with contextlib.suppress(OSError):
                    self._send(status, body.encode(), tag)

            def _send(self, status: int, data: bytes, tag: str | None) -> None:
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                if tag is not None:
                    self.send_header("ETag", tag)
                self.end_headers()
                self.wfile.write(data)

            def _flavored(self) -> bool:
                if self.headers.get("Metadata-Flavor") == "Google":
                    return True
                self._answer(403, "Missing Metadata-Flavor:Google header.")
                return False

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if not self._flavored():
                    return
                recursive = parse_qs(url.query).get("recursive", [""])[0].lower() == "true"
                if url.path in INSTANCE:
                    self._answer(200, INSTANCE[url.path])
                    return
                if url.path == ATTRIBUTES and recursive:
                    self._answer(200, server._all())
                    return
                if url.path == PROJECT_ATTRIBUTES and recursive:
                    self._answer(200, "{}")
                    return
                if not url.path.startswith(ATTRIBUTES):
                    self._answer(404)
                    return
                value = server._get(url.path[len(ATTRIBUTES) :], parse_qs(url.query))
                if value is None:
                    self._answer(404)
                else:
                    self._answer(200, value, etag(value))

            def do_PUT(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                if not self._flavored():
                    return
                if not url.path.startswith(GUEST_ATTRIBUTES):
                    self._answer(404)
                elif server._put(url.path[len(GUEST_ATTRIBUTES) :], body):
                    self._answer(200)
                else:
                    self._answer(403, "Guest attributes endpoint access is disabled.")

        return Handler
