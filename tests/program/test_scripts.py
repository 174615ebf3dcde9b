"""The README's main job, scripts/up, with the real Pulumi CLI: the dev stack
previewed against the testbed (the image built and served, the local backend
and its passphrase made), a failing pulumi command's exit status kept, and a
taken image port reported before pulumi runs."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]


def remove_stack(stack: str) -> None:
    """`pulumi stack rm` of a stack these tests made in the checkout's backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    env.update(
        PULUMI_BACKEND_URL=f"file://{ROOT / '.pulumi-state'}",
        PULUMI_CONFIG_PASSPHRASE_FILE=str(ROOT / ".pulumi-state" / "passphrase"),
    )
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pulumi"), "stack", "rm", stack, "--yes", "--force"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture(autouse=True, scope="module")
def checkout_left_as_found() -> Iterator[None]:
    """pulumi writes the dev stack's encryptionsalt into Pulumi.dev.yaml; when
    these tests made the dev stack, the stack and that change go again (a
    salt committed by mistake would not match another clone's passphrase)."""
    path = ROOT / "Pulumi.dev.yaml"
    before = path.read_text()
    existed = (
        ROOT / ".pulumi-state" / ".pulumi" / "stacks" / "egress-proxies" / "dev.json"
    ).exists()
    yield
    if not existed:
        remove_stack("dev")
        path.write_text(before)


def run_up(*args: str) -> subprocess.CompletedProcess[str]:
    # The user's environment, without a PULUMI_* setting of the developer's own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    return subprocess.run(
        [str(ROOT / "scripts" / "up"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # a proxy image build from nothing
    )


def image_server_gone() -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", 8799), timeout=5).close()


def test_up_preview_shows_the_dev_fleet_from_the_real_cli(testbed: Testbed) -> None:
    done = run_up("preview")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Previewing update (dev)" in done.stdout
    # Two proxies of the dev stack, each with its four objects, and one base.
    for proxy in ("home-0", "home-1"):
        for kind in ("credentials", "overlay", "seed", "domain"):
            assert re.search(
                rf"\+ +pulumi-python:dynamic:Resource +{proxy}-{kind} +create", done.stdout
            ), (
                proxy,
                kind,
                done.stdout,
            )
    assert re.search(
        r"\+ +pulumi-python:dynamic:Resource +testbed-testbed-image-\w+ +create", done.stdout
    )
    # The stack, the two Proxy components, one base, four objects per proxy.
    assert re.search(r"\+ 12 to create", done.stdout), done.stdout
    state = ROOT / ".pulumi-state"
    assert (state / ".pulumi" / "stacks" / "egress-proxies" / "dev.json").is_file()
    passphrase = state / "passphrase"
    assert passphrase.stat().st_mode & 0o077 == 0 and passphrase.read_text().strip()
    assert state.stat().st_mode & 0o077 == 0
    image_server_gone()


def test_up_keeps_a_failing_pulumi_exit_status_and_stops_the_image_server(
    testbed: Testbed,
) -> None:
    done = run_up("preview", "--no-such-flag")
    assert done.returncode != 0
    assert "unknown flag: --no-such-flag" in done.stderr
    image_server_gone()


# What a run elsewhere leaves in a stack file: a salt for another passphrase.
FOREIGN_SALT = (
    "encryptionsalt: v1:aMaEwapgmAM=:v1:vPBbYvhXgSwWnjIY:DeIwAzaOVdBfP8rnv5s2gKXsh7vQPQ==\n"
)


def test_up_drops_another_backends_encryptionsalt_for_a_new_stack(testbed: Testbed) -> None:
    """A clone whose stack file carries the salt of a stack made elsewhere:
    scripts/up's own passphrase cannot match it, and the stack is new here."""
    stack = f"salt{os.getpid()}"
    config = ROOT / f"Pulumi.{stack}.yaml"
    config.write_text((ROOT / "Pulumi.dev.yaml").read_text() + FOREIGN_SALT)
    try:
        done = run_up(stack, "preview")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"Pulumi.{stack}.yaml: dropping the encryptionsalt of another backend" in done.stderr
        assert FOREIGN_SALT not in config.read_text()
    finally:
        remove_stack(stack)
        config.unlink(missing_ok=True)


def test_up_stops_before_pulumi_when_the_image_port_is_taken(testbed: Testbed) -> None:
    with socket.create_server(("127.0.0.1", 8799)):
        done = run_up("preview")
    assert done.returncode == 1
    assert "could not listen on 127.0.0.1:8799 (in use?)" in done.stderr
    assert "Address already in use" in done.stderr
    assert "Previewing" not in done.stdout, "pulumi must not run without the image server"
