"""What the tests of a GCP proxy's boot share: squid's settings and password
file for the metadata, waiting on the guest, and a CONNECT through its squid
(tests/support/gce_guest.py, tests/support/gce_metadata.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import bcrypt

from providers.gcp.squid_sync import AGENT_PATH, UNIT_PATH, squid_digest
from proxyinfra.squid import SquidSettings, password_file_line
from tests.support.gce_guest import Guest
from tests.support.gce_metadata import MetadataServer
from tests.support.squid import EchoServer, connect_status

USER = "crawler"
# Within this the agent has applied a change (it is told at once; squid's
# reload takes about a second).
APPLIED_WITHIN_S = 30.0

# What either boot (startup script or cloud-init) does, the same for both: the
# agent writes squid's files, squid restarts on them, the agent watches...
BOOT_CALLS = [
    "enable squid",
    "restart squid",
    "daemon-reload",
    "enable --now egress-proxies-squid-sync.service",
]
# ...and the files it leaves, with their modes, owners and groups (with auth).
BOOT_FILES = {
    "/etc/squid/squid.conf": "644 root root",
    "/etc/squid/passwords": "640 root proxy",
    AGENT_PATH: "755 root root",
    UNIT_PATH: "644 root root",
}


def settings(port: int, **overrides: object) -> SquidSettings:
    values: dict[str, object] = {
        "allowed_clients": ("127.0.0.1/32",),
        "connect_ports": ("1025-65535",),
        "blocked_destinations": (),
        "auth_username": USER,
        "port": port,
        "listen_address": "127.0.0.1",
    }
    return SquidSettings(**(values | overrides))  # type: ignore[arg-type]


def passwords_of(password: str) -> str:
    return password_file_line(USER, bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode())


def wait_for(what: str, check: Callable[[], bool], guest: Guest) -> None:
    deadline = time.monotonic() + APPLIED_WITHIN_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not within {APPLIED_WITHIN_S} s\n{guest.log('agent.log')}"
            )
        time.sleep(0.2)


def wait_reported(
    server: MetadataServer, squid_conf: str, passwords: str | None, guest: Guest
) -> None:
    """Until the agent reports these files' digest as applied (a guest attribute)."""
    applied = squid_digest(squid_conf, passwords)
    wait_for(
        "the digest reported",
        lambda: server.guest_attribute("egress-proxies/squid-sha256") == applied,
        guest,
    )


def listed(guest: Guest) -> list[str]:
    return guest.run("ls", "-A", "/etc/squid").stdout.split()


def status(port: int, echo: EchoServer, password: str | None) -> int:
    creds = (USER, password) if password is not None else None
    try:
        return connect_status("127.0.0.1", port, f"127.0.0.1:{echo.port}", creds)
    except OSError:
        return 0  # not listening (yet, or for the moment of a reload)


def file_modes(guest: Guest, *paths: str) -> dict[str, str]:
    """Each path's mode, owner and group, as `stat` in the guest gives them."""
    lines = guest.run("stat", "-c", "%n %a %U %G", *paths).stdout.splitlines()
    return dict(line.split(" ", 1) for line in lines)
