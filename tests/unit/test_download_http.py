"""download(): the base image's HTTP side against a real server on loopback:
redirects followed, the environment's proxy used (and NO_PROXY honoured),
errors that name the URL and what went wrong; and the ssh command line the
upload's OpenSSH forward runs (providers/kvm/openssh.py)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from providers.kvm.download import Progress, download, hashed
from providers.kvm.errors import ImageError
from providers.kvm.openssh import ssh_argv
from tests.support.testdriver import TestHost

BODY = bytes(range(256)) * 8192  # 2 MiB
LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


class Mirror(ThreadingHTTPServer):
    """/old redirects to /new, which serves BODY; every request target is kept."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.targets: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Mirror

    def do_GET(self) -> None:
        self.server.targets.append(self.path)
        if self.path.endswith("/old"):
            self.send_response(302)
            self.send_header("Location", "/new")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.endswith("/new"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    server = Mirror()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_proxy_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def fetched(url: str) -> tuple[bytes, str]:
    digest = hashlib.sha256()
    with download(url) as response:
        body = b"".join(hashed(response, digest, Progress(LOG, None), url))
    return body, digest.hexdigest()


def test_a_redirect_is_followed_and_the_body_hashed(mirror: Mirror) -> None:
    body, digest = fetched(mirror.url + "/old")
    assert body == BODY and digest == hashlib.sha256(BODY).hexdigest()
    assert mirror.targets == ["/old", "/new"]


def test_the_environments_proxy_carries_the_request(
    mirror: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", mirror.url)  # the mirror plays the proxy
    body, _ = fetched("http://images.invalid/new")
    assert body == BODY
    assert mirror.targets == ["http://images.invalid/new"]  # absolute form: a proxy request


def test_no_proxy_sends_it_direct(mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    body, _ = fetched(mirror.url + "/new")
    assert body == BODY and mirror.targets == ["/new"]


def test_errors_name_the_url_and_the_cause(mirror: Mirror) -> None:
    with pytest.raises(ImageError, match=r"could not fetch http://127.0.0.1:\d+/gone: HTTP 404"):
        fetched(mirror.url + "/gone")
    refused = "http://user:secret@127.0.0.1:9/x"
    with pytest.raises(ImageError) as error:
        fetched(refused)
    message = str(error.value)
    assert message.startswith("could not fetch http://user:***@127.0.0.1:9/x: NewConnectionError")
    assert "Connection refused" in message and "secret" not in message


def test_the_forward_trusts_exactly_the_configured_host_keys(test_host: TestHost) -> None:
    access = test_host.access(known_hosts_file="/etc/egress/known_hosts", port=2200)
    argv = ssh_argv(access, "/run/x/libvirt.sock", "/usr/bin/ssh")
    options = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]
    assert argv[:4] == ["/usr/bin/ssh", "-F", "/dev/null", "-N"]
    assert "StrictHostKeyChecking=yes" in options and "BatchMode=yes" in options
    assert "UserKnownHostsFile=/etc/egress/known_hosts" in options
    assert "GlobalKnownHostsFile=/dev/null" in options and "IdentitiesOnly=yes" in options
    assert argv[argv.index("-i") + 1] == access.key_file
    assert argv[argv.index("-L") + 1] == f"/run/x/libvirt.sock:{access.socket}"
    assert argv[-6:] == ["-p", "2200", "-l", access.user, "--", access.address]

    insecure = ssh_argv(test_host.access(insecure_ignore_host_key=True), "/s", "ssh")
    options = [insecure[i + 1] for i, arg in enumerate(insecure) if arg == "-o"]
    assert "StrictHostKeyChecking=no" in options and "UserKnownHostsFile=/dev/null" in options
