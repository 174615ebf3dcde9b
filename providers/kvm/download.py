"""A base image's download: the HTTP response streamed in chunks, hashed and
counted on the way, with progress lines, checks of its size and digest, and
the volume capacity its first bytes give.

The body is read with urllib3 (http.client underneath: each 1 MiB chunk is a
few large socket reads), not httpx, whose 64 KiB reads through h11 cost five
times the CPU per GiB, measured in bench/kvm_baseimage_upload.py: that CPU
is taken from the upload running beside it on the same cores."""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Generator, Iterator
from typing import Any

import urllib3
from urllib3.exceptions import HTTPError, MaxRetryError

from providers.kvm.errors import ImageError
from providers.kvm.volumes import MIB, human

Log = logging.LoggerAdapter[logging.Logger]
Response = urllib3.BaseHTTPResponse

PREFETCH = 4  # chunks read ahead of the upload: memory stays a few MiB
CHUNK = MIB  # per HTTP read and per libvirt stream send: memory is a few of these
PROGRESS_SECONDS = 2.0
PROGRESS_PERCENT = 10
QCOW2_MAGIC = b"QFI\xfb"
QCOW2_HEADER = 32  # magic, version, backing file offset and size, cluster bits, virtual size
# Generous read timeout: a mirror may pause, but a dead one must not hang `pulumi up`.
TIMEOUT = urllib3.Timeout(connect=30.0, read=60.0)
# Mirrors redirect; a refused connection is tried again, a broken body never
# (the stream is already on its way into the pool).
RETRIES = urllib3.Retry(total=12, connect=2, read=0, status=0, other=0, redirect=10)


def shown_url(url: Any) -> str:
    """The URL for logs and errors, without a password it may carry."""
    return re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", url) if isinstance(url, str) else repr(url)


def _pool_for(url: str) -> urllib3.PoolManager:
    """Direct, or through the proxy the environment names for this URL
    (HTTP_PROXY, HTTPS_PROXY, NO_PROXY), as curl and pip do."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        return urllib3.ProxyManager(proxy, timeout=TIMEOUT, retries=RETRIES)
    return urllib3.PoolManager(timeout=TIMEOUT, retries=RETRIES)


@contextlib.contextmanager
def download(url: str) -> Iterator[Response]:
    """The response, headers read and status checked, body not yet."""
    shown = shown_url(url)
    with _pool_for(url) as pool:
        try:
            response = pool.request(
                "GET",
                url,
                # identity: the digest is of the file as published, not of a re-encoding.
                headers={"Accept-Encoding": "identity"},
                preload_content=False,
                decode_content=False,
            )
        except HTTPError as error:
            raise ImageError(f"could not fetch {shown}: {_reason(error)}") from None
        try:
            if response.status != 200:
                raise ImageError(
                    f"could not fetch {shown}: HTTP {response.status} {response.reason}"
                )
            yield response
        finally:
            response.release_conn()
            response.close()


def content_length(response: Response) -> int | None:
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def hashed(response: Response, hasher: Any, progress: Progress, shown: str) -> Iterator[bytes]:
    """The body in chunks, hashed and counted on the way; a broken transfer
    becomes an ImageError saying how far it got."""
    try:
        while chunk := response.read(CHUNK, decode_content=False):
            hasher.update(chunk)
            progress.add(len(chunk))
            yield chunk
    except HTTPError as error:
        raise ImageError(
            f"download of {shown} broke off after {progress.done} bytes: {_reason(error)}"
        ) from None


def _reason(error: HTTPError) -> str:
    """What went wrong, without urllib3's pool and retry wrapping."""
    cause: BaseException = (
        error.reason if isinstance(error, MaxRetryError) and error.reason else error
    )
    text = str(
        cause.args[-1] if cause.args and isinstance(cause.args[-1], BaseException) else cause
    )
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def initial_capacity(fmt: str, first: bytes, length: int | None, shown: str) -> int:
    """The capacity to create the volume with. For raw that is the file's size.
    For qcow2 libvirt writes a fresh header of that virtual size (qemu-img
    create) which the upload then overwrites with the image's own; taking the
    image's virtual size from its header keeps libvirt's view right meanwhile."""
    if fmt == "raw":
        return length or 0
    if len(first) < QCOW2_HEADER or not first.startswith(QCOW2_MAGIC):
        raise ImageError(
            f"{shown} is not a qcow2 image (it starts with {first[:16]!r}); "
            "check the url, or set format to what the file is"
        )
    (virtual_size,) = struct.unpack_from(">Q", first, 24)
    return int(virtual_size)


def verify(expected: str | None, digest: str, sent: int, length: int | None, shown: str) -> None:
    if length is not None and sent != length:
        raise ImageError(f"download of {shown} gave {sent} bytes, Content-Length said {length}")
    if expected is not None and digest != expected:
        raise ImageError(
            f"{shown}: sha256 mismatch: expected {expected}, got {digest} ({sent} bytes); "
            "nothing was kept on the host"
        )


class Progress:
    """Info lines during a long download, never per chunk: at most one every
    PROGRESS_SECONDS, and with a known size only after another
    PROGRESS_PERCENT, so a slow multi-GiB download logs about ten lines."""

    def __init__(self, log: Log, total: int | None) -> None:
        self.log = log
        self.total = total or None
        self.done = 0
        self.start = self._last = time.monotonic()
        self._step = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def rate(self) -> float:
        """MiB/s so far."""
        return self.done / MIB / max(self.elapsed, 1e-6)

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last < PROGRESS_SECONDS or self.done == self.total:
            return  # too soon, or finished: the final line says it
        if self.total is None:
            self._last = now
            self.log.info("fetching base image: %s at %.1f MiB/s", human(self.done), self.rate)
            return
        percent = self.done * 100 // self.total
        if percent // PROGRESS_PERCENT <= self._step:
            return
        self._last, self._step = now, percent // PROGRESS_PERCENT
        self.log.info(
            "fetching base image: %s of %s (%d%%) at %.1f MiB/s",
            human(self.done),
            human(self.total),
            percent,
            self.rate,
        )


def prefetched(chunks: Iterator[bytes], depth: int = PREFETCH) -> Generator[bytes, None, None]:
    """The same chunks, read ahead by a thread (at most `depth` of them
    waiting), so the download and the upload overlap instead of taking
    turns. An error of the reader is raised here, where the next chunk is
    asked for; leaving early (the upload failed) stops the reader."""
    box: queue.Queue[tuple[bytes | None, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def read() -> None:
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        box.put((chunk, None), timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put((None, None))
        except BaseException as error:
            box.put((None, error))

    reader = threading.Thread(target=read, name="base-image-download", daemon=True)
    reader.start()
    try:
        while True:
            chunk, error = box.get()
            if error is not None:
                raise error
            if chunk is None:
                return
            yield chunk
    finally:
        stop.set()
        reader.join(timeout=5)
