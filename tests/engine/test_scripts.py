"""The README's main job, scripts/up, with the real Pulumi CLI: the dev stack
previewed against the testbed (the image built and served, the local backend
and its passphrase made), a failing pulumi command's exit status kept, a
taken image port reported before pulumi runs; and on a fresh clone, a stack
converged and its fleet served (`scripts/up STACK serve`, probing through the
testbed's gateway) with nothing set beforehand, the clone's `git status`
clean after each step."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.checkout import fresh_clone, git, run_up, user_env
from tests.support.discovery import all_healthy, free_port, wait_for
from tests.support.pulumi_cli import PULUMI
from tests.support.squid import RunningSquid, loopback_settings, start_squid
from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]


def remove_stack(stack: str) -> None:
    """`pulumi stack rm` of a stack these tests made in the checkout's backend;
    its config file stays (the dev stack's is tracked)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    env.update(
        PULUMI_BACKEND_URL=f"file://{ROOT / '.pulumi-state'}",
        PULUMI_CONFIG_PASSPHRASE_FILE=str(ROOT / ".pulumi-state" / "passphrase"),
    )
    subprocess.run(
        [str(PULUMI), "stack", "rm", stack, "--yes", "--force", "--preserve-config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture(autouse=True, scope="module")
def dev_stack_left_as_found() -> Iterator[None]:
    """When these tests made the dev stack, it goes again; the tracked
    Pulumi.dev.yaml is never written, the test asserts it."""
    existed = (
        ROOT / ".pulumi-state" / ".pulumi" / "stacks" / "egress-proxies" / "dev.json"
    ).exists()
    tracked = (ROOT / "Pulumi.dev.yaml").read_bytes()
    yield
    if not existed:
        remove_stack("dev")
    assert (ROOT / "Pulumi.dev.yaml").read_bytes() == tracked


def image_server_gone() -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", 8799), timeout=5).close()


def test_up_preview_shows_the_dev_fleet_from_the_real_cli(testbed: Testbed) -> None:
    tracked = (ROOT / "Pulumi.dev.yaml").read_bytes()
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
    # The stack's salt is kept beside its state, not in the tracked file.
    assert (ROOT / "Pulumi.dev.yaml").read_bytes() == tracked
    assert "encryptionsalt: " in (state / "config" / "Pulumi.dev.yaml").read_text()
    image_server_gone()


def test_up_keeps_a_failing_pulumi_exit_status_and_stops_the_image_server(
    testbed: Testbed,
) -> None:
    done = run_up("preview", "--no-such-flag")
    assert done.returncode != 0
    assert "unknown flag: --no-such-flag" in done.stderr
    image_server_gone()


@pytest.mark.parametrize("name", ["../dev", "organization/egress-proxies/dev", ".."])
def test_up_refuses_what_is_no_stack_name_before_anything(name: str) -> None:
    """The name makes paths (the stack's config copy under .pulumi-state/,
    the service's database): refused first, nothing installed or made."""
    before = sorted(p.name for p in (ROOT / ".pulumi-state").glob("**/*"))
    done = run_up(name, "preview")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"up: error: '{name}' is not a stack name (letters, digits, '-', '_' and '.')\n"
    )
    assert sorted(p.name for p in (ROOT / ".pulumi-state").glob("**/*")) == before


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
        assert (
            f"Pulumi.{stack}.yaml: not using the encryptionsalt of another backend's stack"
            in done.stderr
        )
        assert FOREIGN_SALT in config.read_text()  # the checkout's file as it was
        copy = (ROOT / ".pulumi-state" / "config" / f"Pulumi.{stack}.yaml").read_text()
        assert FOREIGN_SALT not in copy and "encryptionsalt: " in copy
    finally:
        remove_stack(stack)
        config.unlink(missing_ok=True)
        (ROOT / ".pulumi-state" / "config" / f"Pulumi.{stack}.yaml").unlink(missing_ok=True)


def test_up_stops_before_pulumi_when_the_image_port_is_taken(testbed: Testbed) -> None:
    with socket.create_server(("127.0.0.1", 8799)):
        done = run_up("preview")
    assert done.returncode == 1
    assert "could not listen on 127.0.0.1:8799 (in use?)" in done.stderr
    assert "Address already in use" in done.stderr
    assert "Previewing" not in done.stdout, "pulumi must not run without the image server"


# ---- a fresh clone ------------------------------------------------------------


PASSWORD = "clone-pw-" + "5e77e5a1b2c3"


@pytest.fixture
def squid() -> Iterator[RunningSquid]:
    with start_squid(loopback_settings(auth_username="crawler"), password=PASSWORD) as proxy:
        yield proxy


def end_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL to the process group it leads (the script and the service it
    started), unless the script has already ended it all."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.timeout(900)
def test_up_and_serve_leave_a_fresh_clone_as_it_was(
    testbed: Testbed, squid: RunningSquid, tmp_path: Path
) -> None:
    clone = fresh_clone(tmp_path)
    config = {
        "egress-proxies:providers": [{"name": "corp", "type": "external"}],
        "egress-proxies:proxies": [
            {
                "name": "edge",
                "provider": "corp",
                "url": f"http://crawler:{PASSWORD}@127.0.0.1:{squid.port}",
            }
        ],
    }
    (clone / "Pulumi.lab.yaml").write_text(yaml.safe_dump({"config": config}))
    git(clone, "add", "Pulumi.lab.yaml")
    git(clone, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "lab")
    home = {"PULUMI_HOME": str(tmp_path / "pulumi-home")}

    done = run_up("lab", "--yes", root=clone, **home)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "installing Python packages" not in done.stderr, "the clone's .venv was filled again"
    assert git(clone, "status", "--porcelain", "--untracked-files=all") == ""
    copy = clone / ".pulumi-state" / "config" / "Pulumi.lab.yaml"
    salt = yaml.safe_load(copy.read_text())["encryptionsalt"]
    # Again, on the stack that now exists: its salt taken from beside its state.
    again = run_up("lab", "preview", "--expect-no-changes", root=clone, **home)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert git(clone, "status", "--porcelain", "--untracked-files=all") == ""
    assert yaml.safe_load(copy.read_text())["encryptionsalt"] == salt

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serving = subprocess.Popen(
            [str(clone / "scripts" / "up"), "lab", "serve", "--listen", f"127.0.0.1:{port}"],
            env=user_env(**home, DISCOVERY_STACK_REFRESH_SECONDS="600"),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its group: the service too, should the test fail
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            def healthy() -> bool:
                assert serving.poll() is None, log.read_text()[-3000:]
                try:
                    return all_healthy(client, {"edge"})
                except httpx.TransportError:
                    return False

            # The service's first probe comes at its start; the default interval is 10 s.
            wait_for(healthy, timeout=120, what="the served fleet's proxy healthy")
        target = f"{testbed.gateway}:8798"
        assert f"probing the fleet through {target} (the testbed's gateway)" in log.read_text()
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(timeout=60) == 143, log.read_text()[-3000:]
    finally:
        end_group(serving)
    for address, closed in ((str(testbed.gateway), 8798), ("127.0.0.1", port)):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, closed), timeout=5).close()
    # A probe target of the caller's replaces the testbed's (the flag adds one per use).
    own = "127.0.0.1:9"
    log = tmp_path / "serve-own-target.log"
    serve = [str(clone / "scripts" / "up"), "lab", "serve", "--listen", f"127.0.0.1:{port}"]
    with log.open("w") as out:
        serving = subprocess.Popen(
            [*serve, "--probe-target", own],
            env=user_env(**home, DISCOVERY_STACK_REFRESH_SECONDS="600"),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its group: the service too, should the test fail
        )
    try:
        wait_for(lambda: '"event": "starting"' in log.read_text(), timeout=60, what="the service")
        starting = next(line for line in log.read_text().splitlines() if '"starting"' in line)
        assert json.loads(starting[starting.index("{") :])["probe_targets"] == [own]
        assert "probing the fleet through" not in log.read_text()
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(timeout=60) == 143, log.read_text()[-3000:]
    finally:
        end_group(serving)
    assert git(clone, "status", "--porcelain", "--untracked-files=all") == ""
