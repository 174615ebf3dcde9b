"""Integration fixtures: the testbed made by scripts/testbed.

The testbed is this machine as a libvirt host reached over SSH on loopback:
libvirtd (qemu/TCG), a private sshd, a non-root user in the libvirt group, a
storage pool and an isolated network. `scripts/testbed up` makes it (quick
when it is up already); the test run tears it down again only if it found
none, when its last worker using it ends (tests/support/shared_use.py),
unless TESTBED_KEEP=1.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from providers.kvm.access import HostAccess
from providers.kvm.config import KvmProviderEntry
from tests.support.shared_use import shared_use

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "testbed"
STATE_DIR = ROOT / ".testbed"
ENV_FILE = STATE_DIR / "env"
URI = "qemu:///system"


def run_testbed(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Runs scripts/testbed; output captured, never raises on failure."""
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def parse_env_file(path: Path) -> dict[str, str]:
    """Reads the `export NAME='value'` lines scripts/testbed writes."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ")
        name, _, raw = line.partition("=")
        words = shlex.split(raw)
        values[name] = words[0] if words else ""
    return values


@dataclass(frozen=True)
class Testbed:
    """What `scripts/testbed up` made, from .testbed/env."""

    __test__ = False  # not a test class, whatever its name says

    ssh_port: int
    user: str
    key: Path
    known_hosts: Path
    pool: str
    pool_path: Path
    network: str
    bridge: str
    subnet: IPv4Network
    gateway: IPv4Address
    socket: str
    provider_yaml: Path
    state_dir: Path

    @classmethod
    def from_env_file(cls, path: Path) -> Testbed:
        env = parse_env_file(path)
        return cls(
            ssh_port=int(env["TESTBED_SSH_PORT"]),
            user=env["TESTBED_USER"],
            key=Path(env["TESTBED_KEY"]),
            known_hosts=Path(env["TESTBED_KNOWN_HOSTS"]),
            pool=env["TESTBED_POOL"],
            pool_path=Path(env["TESTBED_POOL_PATH"]),
            network=env["TESTBED_NETWORK"],
            bridge=env["TESTBED_BRIDGE"],
            subnet=IPv4Network(env["TESTBED_SUBNET"]),
            gateway=IPv4Address(env["TESTBED_GATEWAY"]),
            socket=env["TESTBED_SOCKET"],
            provider_yaml=path.parent / "provider.yaml",
            state_dir=path.parent,
        )

    @property
    def sshd_config(self) -> Path:
        """The testbed sshd's config (Port and PidFile lines start a line)."""
        return self.state_dir / "sshd_config"

    @staticmethod
    def script(*args: str) -> subprocess.CompletedProcess[str]:
        """scripts/testbed ARGS (for tests of the script itself)."""
        return run_testbed(*args)

    def ssh_argv(
        self,
        *command: str,
        known_hosts: Path | None = None,
        user: str | None = None,
        options: tuple[str, ...] = (),
    ) -> list[str]:
        """An ssh command line into the testbed with strict host key checking."""
        argv = [
            "ssh",
            "-F",
            "/dev/null",  # nothing from root's own ssh config
            "-i",
            str(self.key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=10",
            *options,
            "-p",
            str(self.ssh_port),
            f"{user or self.user}@127.0.0.1",
        ]
        if command:
            argv.append(shlex.join(command))  # the remote shell splits it again
        return argv

    def ssh(
        self, *command: str, known_hosts: Path | None = None, user: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.ssh_argv(*command, known_hosts=known_hosts, user=user),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def virsh(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """virsh on the system libvirtd, run as the testbed user over SSH."""
        return subprocess.run(
            self.ssh_argv("virsh", "-q", "-c", URI, *args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def testbed_conn(testbed: Testbed) -> Iterator[Any]:
    """A libvirt connection to the testbed's libvirtd (root, local socket)."""
    libvirt.registerErrorHandler(lambda *a: None, None)
    connection = libvirt.open(URI)
    try:
        yield connection
    finally:
        connection.close()


def load_testbed() -> Testbed:
    """The testbed that is up now (for code outside the fixture, e.g. a subprocess)."""
    return Testbed.from_env_file(ENV_FILE)


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    if os.geteuid() != 0:
        pytest.fail(
            "the testbed needs root: it starts libvirtd and sshd and adds a user", pytrace=False
        )

    # Only a testbed this run made from nothing is torn down afterwards, by
    # the last worker using it; one that was there (a developer's, the dev
    # stack's) stays.
    def up() -> None:
        result = run_testbed("up")
        if result.returncode != 0:
            pytest.fail(
                f"scripts/testbed up failed (exit {result.returncode}):\n{result.stderr}",
                pytrace=False,
            )

    def down() -> None:
        run_testbed("down")

    with shared_use(
        "testbed",
        is_up=ENV_FILE.exists,
        up=up,
        down=down,
        keep=os.environ.get("TESTBED_KEEP") == "1",
    ):
        yield load_testbed()


def access_for(testbed: Testbed, **changes: Any) -> HostAccess:
    """How the kvm provider reaches the testbed (its provider.yaml), with CHANGES."""
    entry = KvmProviderEntry.model_validate(yaml.safe_load(testbed.provider_yaml.read_text()))
    access = HostAccess.of(entry, entry.kvm.hosts[0], ROOT)
    return dataclasses.replace(access, **changes)


def refresh_pool(pool: Any) -> None:
    """Re-reads a pool's directory (files changed behind libvirt's back). Tests
    on other workers upload into the same pool, and libvirt refuses a refresh
    while an upload runs ("asynchronous jobs running"); its own list is
    current then anyway, so that refusal is not an error here."""
    import libvirt  # the testbed's tests have it; importing this module needs it not

    try:
        pool.refresh(0)
    except libvirt.libvirtError as error:
        if "asynchronous jobs running" not in str(error):
            raise
