"""What the gcp and kubernetes backends hand to real programs, run by those programs.

The stack program runs once under mocks; then the Kubernetes ConfigMap's
squid.conf and Secret run in a real squid 5.7 as the container would run
them (as the unprivileged proxy user, with the container's arguments), the
GCP startup script and squid-sync agent pass bash and shellcheck (they run
in a guest of namespaces in test_gcp_squid_sync.py), and the GCP user-data
goes through cloud-init's own schema check. All traffic stays on loopback.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from providers.gcp.squid_sync import (
    AGENT_PATH,
    AGENT_SCRIPT,
    BOOT_COMMANDS,
    CONF_KEY,
    PASSWORDS_KEY,
    UNIT,
    UNIT_PATH,
    squid_metadata,
)
from providers.kubernetes.container import (
    CONFIG_DIR,
    CONFIG_KEY,
    SQUID_ARGS,
    SQUID_COMMAND,
    container_settings,
)
from proxyinfra.config import Squid
from proxyinfra.squid import SquidSettings, render_squid_conf, settings_from_config
from tests.harness.program import ProgramResult, run_program
from tests.support.mock_clouds import HOOK, UBUNTU
from tests.support.squid import (
    EchoServer,
    assert_tunnel_works,
    free_port,
    proxy_connect,
    squid_parse,
)
from tests.support.stack_config import placement, proxy, squid, stack_config

pytestmark = pytest.mark.integration

CLOUD_INIT = shutil.which("cloud-init") or "/usr/bin/cloud-init"
SHELLCHECK = shutil.which("shellcheck")
SQUID_USER = "proxy"
# A lab squid block: loopback clients and targets, so a local echo server can
# stand in for a site. 127.0.0.2 is loopback too, but not an allowed client.
SQUID_BLOCK = squid(
    "127.0.0.1/32",
    "10.0.0.0/8",
    connect_ports=["1025-65535"],
    blocked_destinations=[],
    username="crawler",
)
OWN_USER_DATA = "#cloud-config\npackages: [curl]\nruncmd: [[touch, /run/own-user-data]]\n"


def config() -> dict[str, Any]:
    gcp = {
        "project": "crawl-proj-1",
        "region": "europe-west1",
        "zones": ["europe-west1-b"],
        "images": {
            "debian": "projects/debian-cloud/global/images/family/debian-12",
            "ubuntu": UBUNTU,
        },
    }
    providers = [
        {"name": "gcp", "type": "gcp", "gcp": gcp},
        {"name": "cluster", "type": "kubernetes", "kubernetes": {}},
    ]
    proxies = [
        proxy("vm", "gcp", where=placement("e2-micro", "debian")),
        proxy("ubuntu", "gcp", where=placement("e2-micro", "ubuntu"), user_data=OWN_USER_DATA),
        proxy("pod", "cluster"),
    ]
    return stack_config(providers, proxies, SQUID_BLOCK)


@dataclasses.dataclass(frozen=True)
class Produced:
    """What the program handed to the clouds, per proxy."""

    result: ProgramResult

    def inputs(self, name: str) -> dict[str, Any]:
        return self.result.resource(name).inputs

    def password(self, replica: str) -> str:
        entry = next(p for p in self.result.output("fleet")["proxies"] if p["name"] == replica)
        password: str = entry["auth"]["password"]
        return password


@pytest.fixture(scope="module")
def produced() -> Produced:
    return Produced(run_program("proxyinfra.program:main", config(), new_resource_hook=HOOK))


# --- kubernetes: the ConfigMap and Secret in a real squid ------------------------


def test_config_map_squid_conf_parses(produced: Produced, tmp_path: Path) -> None:
    conf = tmp_path / "squid.conf"
    conf.write_text(produced.inputs("pod-0-squid-conf")["data"][CONFIG_KEY])
    code, findings = squid_parse(conf)
    assert code == 0 and findings == []


class ContainerSquid:
    """squid started the way the pod starts it: as the proxy user, with the
    container's command and arguments; only the paths move into a directory
    of its own, standing in for the pod's volumes."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="egress-k8s-squid-"))
        os.chmod(self.dir, 0o755)
        self.user = pwd.getpwnam(SQUID_USER)
        for sub in ("run", "spool"):  # the pod's emptyDirs, writable by squid
            (self.dir / sub).mkdir()
            os.chown(self.dir / sub, self.user.pw_uid, self.user.pw_gid)
        self.stderr = self.dir / "stderr"
        self.service = "egk8s" + os.urandom(5).hex()
        self.process: subprocess.Popen[bytes] | None = None

    def with_paths(self, settings: SquidSettings) -> SquidSettings:
        """SETTINGS with the renderer's paths moved into this directory."""
        return dataclasses.replace(
            settings,
            password_file=str(self.dir / "passwords"),
            pid_file=str(self.dir / "run" / "squid.pid"),
            coredump_dir=str(self.dir / "spool"),
        )

    def start(self, squid_conf: str, passwords: str) -> None:
        conf = self.dir / CONFIG_KEY
        conf.write_text(squid_conf)
        os.chmod(conf, 0o444)
        secret = self.dir / "passwords"
        secret.write_text(passwords)
        # As the Secret volume mounts it: owner root, group fsGroup, 0440.
        os.chown(secret, 0, self.user.pw_gid)
        os.chmod(secret, 0o440)
        args = [conf.as_posix() if a == f"{CONFIG_DIR}/{CONFIG_KEY}" else a for a in SQUID_ARGS]
        with self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [*SQUID_COMMAND, *args, "-n", self.service],
                user=self.user.pw_uid,
                group=self.user.pw_gid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            # With cache_log /dev/null, `-d 1` puts this on stderr: what
            # `kubectl logs` shows.
            if b"Accepting HTTP Socket connections" in self.stderr.read_bytes():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"squid did not start:\n{self.stderr.read_text(errors='replace')}")

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for path in Path("/dev/shm").glob(f"{self.service}-*"):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def connect_from(
    source: str, port: int, target: int, credentials: tuple[str, str] | None
) -> tuple[int, socket.socket]:
    """CONNECT 127.0.0.1:target through the proxy from a chosen loopback address."""
    status, _, sock = proxy_connect(
        "127.0.0.1", port, f"127.0.0.1:{target}", credentials, source=source
    )
    return status, sock


def test_config_map_and_secret_run_in_squid_as_the_container_would(
    produced: Produced, echo: EchoServer
) -> None:
    if os.geteuid() != 0:
        pytest.skip("starting squid as the proxy user needs root")
    config_map = produced.inputs("pod-0-squid-conf")["data"][CONFIG_KEY]
    squid = Squid.model_validate(SQUID_BLOCK)
    # The ConfigMap is exactly the renderer's output for the container...
    settings = container_settings(squid)
    assert render_squid_conf(settings) == config_map
    # ...so the same settings with this machine's paths and a free loopback
    # port are the ConfigMap's config, running here.
    running = ContainerSquid()
    try:
        port = free_port()
        here = running.with_paths(
            dataclasses.replace(settings, listen_address="127.0.0.1", port=port)
        )
        running.start(
            render_squid_conf(here), produced.inputs("pod-0-auth")["stringData"]["passwords"]
        )
        password = produced.password("pod-0")

        status, sock = connect_from("127.0.0.1", port, echo.port, ("crawler", password))
        assert status == 200
        assert_tunnel_works(sock)
        for credentials in (("crawler", password + "x"), ("crawler", "nope"), None):
            status, sock = connect_from("127.0.0.1", port, echo.port, credentials)
            sock.close()
            assert status == 407, credentials
        # 127.0.0.2 is not an allowed client: 403, even with the right password.
        status, sock = connect_from("127.0.0.2", port, echo.port, ("crawler", password))
        sock.close()
        assert status == 403
        assert (running.dir / "run" / "squid.pid").exists()  # squid wrote its emptyDir

        # A Secret update swaps the mounted file; squid's helper re-reads it
        # without a restart (the reason it is mounted as a directory).
        time.sleep(1.1)  # the helper compares mtimes in whole seconds
        rotated = running.dir / "passwords.new"
        digest = bcrypt.hashpw(b"rotated", bcrypt.gensalt(rounds=4)).decode()
        rotated.write_text(f"crawler:{digest}\n")
        os.chown(rotated, 0, running.user.pw_gid)
        os.chmod(rotated, 0o440)
        rotated.replace(running.dir / "passwords")
        status, sock = connect_from("127.0.0.1", port, echo.port, ("crawler", "rotated"))
        sock.close()
        assert status == 200
    finally:
        running.close()


# --- gcp: the startup script and the user-data -----------------------------------


def startup_script(produced: Produced) -> str:
    script: str = produced.inputs("vm-0-instance")["metadata"]["startup-script"]
    return script


def test_startup_script_and_agent_pass_bash_and_shellcheck(
    produced: Produced, tmp_path: Path
) -> None:
    if SHELLCHECK is None:
        pytest.skip("shellcheck is not installed")
    for name, text in [("startup.sh", startup_script(produced)), ("agent.sh", AGENT_SCRIPT)]:
        script = tmp_path / name
        script.write_text(text)
        subprocess.run(["bash", "-n", str(script)], check=True)
        result = subprocess.run([SHELLCHECK, str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_user_data_passes_cloud_init_schema_and_squid_parse(
    produced: Produced, tmp_path: Path
) -> None:
    metadata = produced.inputs("ubuntu-0-instance")["metadata"]
    user_data = tmp_path / "user-data"
    user_data.write_text(metadata["user-data"])
    result = subprocess.run(
        [CLOUD_INIT, "schema", "--config-file", str(user_data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout
    document = yaml.safe_load(metadata["user-data"])
    # The agent and its unit, then what the startup script runs.
    files = {f["path"]: f for f in document["write_files"]}
    assert files[AGENT_PATH]["content"] == AGENT_SCRIPT
    assert files[AGENT_PATH]["permissions"] == "0755"
    assert files[UNIT_PATH]["content"] == UNIT
    assert document["runcmd"][1] == " && ".join(BOOT_COMMANDS)  # stops at the first failure
    assert ["touch", "/run/own-user-data"] in document["runcmd"]  # the user's, merged in
    # squid's files beside it, for the agent.
    conf = tmp_path / "squid.conf"
    conf.write_text(metadata[CONF_KEY])
    code, findings = squid_parse(conf)
    assert code == 0 and findings == []
    digest = metadata[PASSWORDS_KEY].rstrip("\n").partition(":")[2]
    assert bcrypt.checkpw(produced.password("ubuntu-0").encode(), digest.encode())


def test_squid_metadata_refuses_what_would_break_squid() -> None:
    conf = render_squid_conf(settings_from_config(Squid.model_validate(SQUID_BLOCK)))
    with pytest.raises(ValueError, match="authenticates against /etc/squid/passwords"):
        squid_metadata(conf, None)  # squid would not start without the file
    with pytest.raises(ValueError, match="does not read /etc/squid/passwords"):
        squid_metadata("http_port 3128\n", "crawler:$2b$04$x\n")
    with pytest.raises(ValueError, match="ending with a newline"):
        squid_metadata("http_port 3128", None)
