"""The README's main job, scripts/up: a missing Pulumi CLI reported clearly, and
the dev stack's surroundings (testbed, image, image server, backend) in place
while `pulumi up` runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]


def test_up_without_pulumi_cli_names_the_install_link(tmp_path: Path) -> None:
    # A PATH with bash and coreutils but no pulumi.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cat"):
        (bin_dir / tool).symlink_to(
            Path("/usr/bin", tool) if Path("/usr/bin", tool).exists() else Path("/bin", tool)
        )
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(bin_dir / "bash"), str(ROOT / "scripts" / "up")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 127
    assert "Pulumi CLI was not found" in done.stderr
    assert "https://www.pulumi.com/docs/install/" in done.stderr


STUB = """\
#!{python}
# A stand-in for the Pulumi CLI (not installable here) that records how
# scripts/up calls it and what is served to the provider while `up` runs.
import json, os, sys, urllib.request
record = {{
    "argv": sys.argv[1:],
    "backend": os.environ.get("PULUMI_BACKEND_URL"),
    "passphrase_file": os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"),
}}
if sys.argv[1] == "up":
    with urllib.request.urlopen("http://127.0.0.1:8799/debian-proxy.qcow2", timeout=30) as answer:
        size = sum(len(chunk) for chunk in iter(lambda: answer.read(1 << 20), b""))
        record["served"] = [answer.status, size]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
if sys.argv[1] == "up":
    sys.exit(int(os.environ.get("STUB_UP_EXIT", "0")))
"""


def run_up(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """scripts/up dev --yes with the recording stand-in first on PATH: (result, its log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "pulumi"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_LOG=str(log), **extra)
    done = subprocess.run(
        [str(ROOT / "scripts" / "up"), "dev", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # a proxy image build from nothing
    )
    return done, log


def test_up_serves_the_proxy_image_to_pulumi_up_on_the_dev_stack(
    testbed: Testbed, tmp_path: Path
) -> None:
    # Everything scripts/up does around the CLI, for real: bootstrap, the
    # testbed, the image build (cached), the image server, the local backend.
    done, log = run_up(tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    select, up = [json.loads(line) for line in log.read_text().splitlines()]
    assert select["argv"] == ["stack", "select", "--create", "dev"]
    assert up["argv"] == ["up", "--stack", "dev", "--yes"]
    for call in (select, up):
        assert call["backend"] == f"file://{ROOT}/.pulumi-state"
        assert call["passphrase_file"] == f"{ROOT}/.pulumi-state/passphrase"
    image = ROOT / ".cache" / "images" / "debian-proxy.qcow2"
    assert up["served"] == [200, image.stat().st_size]
    passphrase = ROOT / ".pulumi-state" / "passphrase"
    assert passphrase.stat().st_mode & 0o077 == 0 and passphrase.read_text().strip()
    # The image server is gone (waited for) by the time the script returns.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", 8799), timeout=5).close()


def test_up_stops_before_pulumi_when_the_image_port_is_taken(
    testbed: Testbed, tmp_path: Path
) -> None:
    with socket.create_server(("127.0.0.1", 8799)):
        done, log = run_up(tmp_path)
    assert done.returncode == 1
    assert "could not listen on 127.0.0.1:8799 (in use?)" in done.stderr
    assert "Address already in use" in done.stderr
    assert not log.exists(), "pulumi must not run without the image server"


def test_up_fails_as_pulumi_up_fails_and_still_stops_the_image_server(
    testbed: Testbed, tmp_path: Path
) -> None:
    done, log = run_up(tmp_path, STUB_UP_EXIT="3")
    assert done.returncode == 3, done.stderr[-2000:]
    assert len(log.read_text().splitlines()) == 2
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", 8799), timeout=5).close()
