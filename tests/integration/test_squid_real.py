"""The rendered squid.conf and cloud-init documents against the real programs.

squid 5 and cloud-init come from Debian; every connection stays on 127.0.0.1.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from proxyinfra.cloudinit import INSTALL_SQUID, render_user_data
from proxyinfra.squid import (
    SquidSettings,
    hash_password,
    password_file_line,
    render_squid_conf,
)
from tests.support.squid import (
    EchoServer,
    RunningSquid,
    assert_tunnel_works,
    loopback_settings,
    proxy_connect,
    squid_parse,
    start_squid,
)

pytestmark = pytest.mark.integration

NCSA_AUTH = "/usr/lib/squid/basic_ncsa_auth"
CLOUD_INIT = shutil.which("cloud-init") or "/usr/bin/cloud-init"
# Exercises squid's URL-escaping of helper input and non-ASCII bytes.
PASSWORD = "pa ss:wörd%20"


# --- local targets -----------------------------------------------------------


class RecordingHandler(http.server.BaseHTTPRequestHandler):
    """Answers a cacheable 200 and records the headers each request carried."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b"hello from origin\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "public, max-age=3600")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


# --- a minimal proxy client --------------------------------------------------


def connect(
    proxy_port: int, target_port: int, credentials: tuple[str, str] | None = None
) -> tuple[int, bytes, socket.socket]:
    """CONNECT 127.0.0.1:target through the proxy: (status, head, socket)."""
    return proxy_connect("127.0.0.1", proxy_port, f"127.0.0.1:{target_port}", credentials)


def connect_status(
    proxy_port: int, target_port: int, credentials: tuple[str, str] | None = None
) -> int:
    status, _, sock = connect(proxy_port, target_port, credentials)
    sock.close()
    return status


def http_get(proxy_port: int, url: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as sock:
        host = url.split("/")[2]
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


# --- (1) squid -k parse ----------------------------------------------------------

PARSE_VARIANTS = {
    "minimal": SquidSettings(allowed_clients=("10.0.0.0/8",)),
    "auth": SquidSettings(allowed_clients=("10.0.0.0/8",), auth_username="crawler"),
    "several-networks-and-ranges": SquidSettings(
        port=8080,
        allowed_clients=("10.0.0.0/8", "10.20.0.0/16", "192.168.7.0/24", "2001:db8::/32"),
        connect_ports=("443", "8443-8450", "8445", "9000-9100"),
        safe_ports=("80", "8080-8090"),
        auth_username="crawler",
    ),
    "loopback-test-style": loopback_settings(listen_address="127.0.0.1"),
    "ipv6-covers-ipv4": SquidSettings(
        allowed_clients=("::/1", "128.0.0.0/1", "::ffff:10.0.0.0/104", "fd00::/8")
    ),
    "ipv6-listen-open-with-auth": SquidSettings(
        allowed_clients=("0.0.0.0/0", "::/0"), listen_address="::1", auth_username="c"
    ),
}


@pytest.mark.parametrize("name", sorted(PARSE_VARIANTS))
def test_rendered_config_parses_cleanly(name: str, tmp_path: Path) -> None:
    conf = tmp_path / "squid.conf"
    conf.write_text(render_squid_conf(PARSE_VARIANTS[name]))
    code, findings = squid_parse(conf)
    assert code == 0
    assert findings == []


@pytest.mark.parametrize(
    "extra", ["via off", "acl allowed_clients src 10.1.0.0/16", "http_access allow bogus_acl"]
)
def test_parse_check_catches_problems(extra: str, tmp_path: Path) -> None:
    # Control: the checks above would see a warning or an error.
    conf = tmp_path / "squid.conf"
    base = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
    conf.write_text(base + extra + "\n")
    code, findings = squid_parse(conf)
    assert code != 0 or findings


# --- (2) a running squid ---------------------------------------------------------


@pytest.fixture(scope="module")
def open_squid(echo: EchoServer) -> Iterator[RunningSquid]:
    # CONNECT allowed to a range holding the echo port, and nothing above it.
    settings = loopback_settings(connect_ports=("443", f"{echo.port - 1}-{echo.port}"))
    with start_squid(settings) as squid:
        yield squid


@pytest.fixture(scope="module")
def auth_squid(echo: EchoServer) -> Iterator[RunningSquid]:
    with start_squid(loopback_settings(auth_username="crawler"), PASSWORD) as squid:
        yield squid


def test_connect_tunnels_bytes(open_squid: RunningSquid, echo: EchoServer) -> None:
    status, head, sock = connect(open_squid.port, echo.port)
    assert status == 200, head
    assert_tunnel_works(sock)


def test_connect_outside_connect_ports_is_denied(
    open_squid: RunningSquid, echo: EchoServer
) -> None:
    assert echo.port + 1 <= 65535
    # Just above the allowed range, and a well-known port: refused by the ACL
    # (403), not by a failed connection (503).
    assert connect_status(open_squid.port, echo.port + 1) == 403
    assert connect_status(open_squid.port, 25) == 403


def test_client_outside_allowed_clients_gets_403(echo: EchoServer) -> None:
    # 127.0.0.1 is not in 10.0.0.0/8; with auth on, a stranger must still get
    # 403 and never a 407 challenge, even with the right password.
    settings = loopback_settings(allowed_clients=("10.0.0.0/8",), auth_username="crawler")
    with start_squid(settings, PASSWORD) as squid:
        assert connect_status(squid.port, echo.port) == 403
        assert connect_status(squid.port, echo.port, ("crawler", PASSWORD)) == 403


def test_auth_wrong_or_missing_password_gets_407(
    auth_squid: RunningSquid, echo: EchoServer
) -> None:
    status, head, sock = connect(auth_squid.port, echo.port)
    sock.close()
    assert status == 407
    assert b'Proxy-Authenticate: Basic realm="egress-proxy"' in head
    assert connect_status(auth_squid.port, echo.port, ("crawler", PASSWORD + "x")) == 407
    assert connect_status(auth_squid.port, echo.port, ("crawler", "pa ss:wörd ")) == 407
    assert connect_status(auth_squid.port, echo.port, ("intruder", PASSWORD)) == 407


def test_auth_right_password_tunnels(auth_squid: RunningSquid, echo: EchoServer) -> None:
    # Credentials as a probe would take them from the helper's proxy URL.
    url = urlsplit(auth_squid.proxy_url)
    assert (url.hostname, url.port) == ("127.0.0.1", auth_squid.port)
    assert url.username is not None and url.password is not None
    credentials = (unquote(url.username), unquote(url.password))
    assert credentials == ("crawler", PASSWORD)
    status, head, sock = connect(auth_squid.port, echo.port, credentials)
    assert status == 200, head
    assert_tunnel_works(sock)


def test_default_settings_block_loopback_destinations(echo: EchoServer) -> None:
    # Production defaults: the proxy host's own services are out of reach.
    settings = SquidSettings(allowed_clients=("127.0.0.1/32",), connect_ports=("1025-65535",))
    with start_squid(settings) as squid:
        assert connect_status(squid.port, echo.port) == 403


def test_plain_http_hides_client_and_caches_nothing(
    open_squid: RunningSquid, origin: http.server.ThreadingHTTPServer
) -> None:
    url = f"http://127.0.0.1:{origin.server_address[1]}/page"
    RecordingHandler.seen.clear()
    for _ in range(2):
        status, data = http_get(open_squid.port, url)
        assert status == 200, data[:300]
        assert data.endswith(b"hello from origin\n")
    # A cacheable answer fetched twice reached the origin twice: no cache.
    assert len(RecordingHandler.seen) == 2
    for headers in RecordingHandler.seen:
        assert "via" not in headers
        assert "x-forwarded-for" not in headers
        assert "forwarded" not in headers
        # squid's own Cache-Control on a request that had none marks it as proxied.
        assert "cache-control" not in headers
        assert not any("127.0.0.1" in v and k != "host" for k, v in headers.items())


def test_plain_http_to_unsafe_port_is_denied(open_squid: RunningSquid) -> None:
    status, _ = http_get(open_squid.port, "http://127.0.0.1:25/")
    assert status == 403


def test_stop_and_start_again_on_the_same_port(echo: EchoServer) -> None:
    with start_squid(loopback_settings()) as squid:
        port, first_pid = squid.port, squid.pid
        squid.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        squid.start()
        assert squid.port == port
        assert squid.pid != first_pid
        status, _, sock = connect(squid.port, echo.port)
        assert status == 200
        assert_tunnel_works(sock)
        workdir = squid.workdir
    assert not workdir.exists()
    assert not list(Path("/dev/shm").glob(f"{squid.service_name}-*"))


def test_hash_works_with_the_real_ncsa_helper(tmp_path: Path) -> None:
    # The helper checks the hash through crypt(3): bcrypt $2b$ must be accepted.
    passwords = tmp_path / "passwords"
    passwords.write_text(password_file_line("crawler", hash_password("s3cret-pw", rounds=4)))
    lines = "crawler s3cret-pw\ncrawler s3cret-px\nnobody s3cret-pw\n"
    result = subprocess.run(
        [NCSA_AUTH, str(passwords)], input=lines, capture_output=True, text=True, timeout=30
    )
    answers = [line.split(" ", 1)[0] for line in result.stdout.splitlines()]
    assert answers == ["OK", "ERR", "ERR"]


# --- (3) cloud-init's own schema check -------------------------------------------


USER_DATA = """\
#cloud-config
packages: [htop]
package_update: true
runcmd:
  - [sh, -c, "echo user-step"]
write_files:
  - path: /etc/motd
    content: managed proxy
    permissions: '0644'
timezone: Etc/UTC
"""


def cloud_init_schema(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "user-data"
    path.write_text(text)
    return subprocess.run(
        [CLOUD_INIT, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("variant", ["plain", "auth", "auth+userData"])
def test_user_data_passes_cloud_init_schema(variant: str, tmp_path: Path) -> None:
    auth = variant != "plain"
    settings = SquidSettings(
        allowed_clients=("10.0.0.0/8",), auth_username="crawler" if auth else None
    )
    passwords = password_file_line("crawler", hash_password("pw", rounds=4)) if auth else None
    user_data = USER_DATA if variant.endswith("userData") else None
    text = render_user_data(
        render_squid_conf(settings), passwords, user_data, hostname="proxy-0123456789"
    )
    result = cloud_init_schema(tmp_path, text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Valid cloud-config")
    assert "deprecat" not in (result.stdout + result.stderr).lower()
    assert result.stderr == ""
    assert len(yaml.safe_load(text)["write_files"]) == (3 if user_data else 1 + int(auth))


def test_schema_check_catches_a_bad_merged_value(tmp_path: Path) -> None:
    # Control: a user value of the wrong type survives the merge (scalars are
    # the user's) and cloud-init's checker rejects it.
    conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
    text = render_user_data(conf, None, "#cloud-config\npackage_update: 'yes please'\n")
    result = cloud_init_schema(tmp_path, text)
    assert result.returncode != 0
    assert "package_update" in result.stdout + result.stderr


@pytest.mark.parametrize("installed", [True, False])
def test_install_step_runs_apt_only_when_squid_is_missing(installed: bool, tmp_path: Path) -> None:
    # The real runcmd line under the real /bin/sh, with the squid binary it
    # looks for and apt-get moved into tmp_path.
    squid = tmp_path / "squid"
    if installed:
        squid.write_text("#!/bin/sh\n")
        squid.chmod(0o755)
    calls = tmp_path / "calls"
    apt = tmp_path / "bin" / "apt-get"
    apt.parent.mkdir()
    apt.write_text(f'#!/bin/sh\necho "$DEBIAN_FRONTEND $*" >> {calls}\n')
    apt.chmod(0o755)
    line = INSTALL_SQUID.replace("/usr/sbin/squid", str(squid))
    assert line != INSTALL_SQUID
    result = subprocess.run(
        ["/bin/sh", "-ec", line],
        env={"PATH": f"{apt.parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    recorded = calls.read_text().splitlines() if calls.exists() else []
    if installed:
        assert recorded == []
    else:
        assert recorded == [
            " update",
            "noninteractive install -y -o Dpkg::Options::=--force-confold squid",
        ]
