"""A small HTTP file server on 127.0.0.1 for tests and benchmarks.

    with FileServer() as server:
        url = server.add("/disk.qcow2", data=image_bytes)
        ...                                   # fetch url
        assert server.count("/disk.qcow2") == 1

Each path serves bytes from memory or a file on disk, with a true
Content-Length by default. A route can also misbehave the ways a real mirror
does: stop after N bytes and drop the connection (a cut-off download), send
no Content-Length at all (the body ends when the connection closes), or
announce a Content-Length other than the real size. Every request (GET and
HEAD) is counted per path, so a test can prove that a cached image caused no
download.

Built on the standard library's ThreadingHTTPServer: one thread per
connection, so a slow or abandoned client never blocks the next test.
LoopbackServer serves any handler class the same way (a fake proxy, say):

    class Refusing(QuietHandler):
        def do_CONNECT(self) -> None: ...

    server = LoopbackServer(Refusing)         # serving on server.port at once
    ...
    server.close()
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

CHUNK = 1024 * 1024


@dataclass
class Route:
    """What one path answers. `length` overrides the announced Content-Length
    (None: the true size); `send_length=False` announces none; `cut_after`
    closes the connection after that many body bytes; `rate` paces the body
    (bytes per second) to make a short file a long download."""

    data: bytes | None = None
    file: Path | None = None
    status: int = 200
    content_type: str = "application/octet-stream"
    send_length: bool = True
    length: int | None = None
    cut_after: int | None = None
    rate: float | None = None

    @property
    def size(self) -> int:
        if self.data is not None:
            return len(self.data)
        assert self.file is not None
        return self.file.stat().st_size

    def open(self) -> IO[bytes]:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.file is not None
        return self.file.open("rb")


class ServedInThread:
    """A ThreadingHTTPServer (`_httpd`, set by the subclass) served from a
    daemon thread between start() and stop(), or over a `with` block."""

    _httpd: ThreadingHTTPServer
    _thread: threading.Thread | None = None

    def _serve(self, httpd: ThreadingHTTPServer) -> None:
        httpd.daemon_threads = True
        self._httpd = httpd

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, name="test-http", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that writes no access log: tests read what they record."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LoopbackServer(ServedInThread):
    """`handler` served on a free port of 127.0.0.1 from a daemon thread,
    from construction until close()."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._serve(ThreadingHTTPServer(("127.0.0.1", 0), handler))
        self.start()

    def close(self) -> None:
        self.stop()


class FileServer(ServedInThread):
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._routes: dict[str, Route] = {}
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._host = host
        self._serve(ThreadingHTTPServer((host, 0), _handler_for(self)))

    # -- routes ------------------------------------------------------------------------

    def url(self, path: str) -> str:
        return f"http://{self._host}:{self.port}{path}"

    def add(
        self,
        path: str,
        *,
        data: bytes | None = None,
        file: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> str:
        """Serve `data` or `file` at `path` (replacing what was there); returns the URL.
        `options` are the other fields of :class:`Route`."""
        if (data is None) == (file is None):
            raise ValueError("give exactly one of data and file")
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        route = Route(data=data, file=Path(file) if file is not None else None, **options)
        with self._lock:
            self._routes[path] = route
        return self.url(path)

    def add_tree(self, prefix: str, directory: Path) -> str:
        """Serve every file below `directory` under `prefix`; returns its URL."""
        for file in sorted(directory.rglob("*")):
            if file.is_file():
                self.add(f"{prefix}/{file.relative_to(directory).as_posix()}", file=file)
        return self.url(prefix)

    def route(self, path: str) -> Route | None:
        with self._lock:
            return self._routes.get(path)

    def count(self, path: str) -> int:
        """Requests seen for `path` so far (any method, any outcome)."""
        with self._lock:
            return self._counts[path]

    def _seen(self, path: str) -> Route | None:
        with self._lock:
            self._counts[path] += 1
            return self._routes.get(path)


def _handler_for(server: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        files = server

    return Handler


class _Handler(QuietHandler):  # tests read counts, not access logs
    files: FileServer
    protocol_version = "HTTP/1.1"  # keep-alive, like a real mirror

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        # Decoded as a web server does: apt asks for `+` and `~` as %2b and %7e.
        path = urllib.parse.unquote(self.path.split("?", 1)[0])
        route = self.files._seen(path)
        if route is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self.send_response(route.status)
        self.send_header("Content-Type", route.content_type)
        if route.send_length:
            self.send_header(
                "Content-Length", str(route.length if route.length is not None else route.size)
            )
        else:
            # Without a length the body ends where the connection does.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body:
            self._send_body(route)

    def _send_body(self, route: Route) -> None:
        limit = route.size if route.cut_after is None else min(route.cut_after, route.size)
        with route.open() as source, contextlib.suppress(ConnectionError):
            if route.file is not None and route.rate is None:
                # A file at full speed goes out by sendfile(2), as from a real
                # mirror: read-and-write in Python took 3.4 s of CPU per GiB,
                # on the same two cores as the provider it serves.
                self.wfile.flush()
                self.connection.sendfile(source, 0, limit)
            else:
                self._copy(source, limit, route.rate)
        if route.cut_after is not None or route.length not in (None, route.size):
            # The body is not what the headers promised: the connection
            # cannot be reused, and closing it is what the client must notice.
            self.close_connection = True

    def _copy(self, source: IO[bytes], limit: int, rate: float | None) -> None:
        piece = CHUNK if rate is None else max(1, int(rate / 10))
        start = time.monotonic()
        sent = 0
        while sent < limit:
            chunk = source.read(min(piece, limit - sent))
            if not chunk:
                break
            self.wfile.write(chunk)
            sent += len(chunk)
            if rate is not None:  # sleep until the paced time of `sent`
                time.sleep(max(0.0, start + sent / rate - time.monotonic()))
        self.wfile.flush()
