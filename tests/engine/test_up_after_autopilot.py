"""scripts/up and the autopilot on one stack file: the autopilot's recycle
(a generation written into the project's `Pulumi.<stack>.yaml`, then a
targeted update) is what `scripts/up` runs next, so its next run changes
nothing (`preview --expect-no-changes`), and the autopilot leaves the
checkout's stack file holding its change and nothing of the backend's
(no `encryptionsalt`).

On a fresh clone, as the README's operator has it: a stack of two proxies on
a simulated kvm host made by `scripts/up STACK --yes`, the autopilot run
from the clone (`--once`) with the environment `scripts/up` uses (its file
backend in `.pulumi-state/`, its passphrase file), the real discovery
service answering its signals.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from providers.kvm.simulated import SIMULATED_HOSTS_ENV
from tests.support.baseimages import random_qcow2, serve
from tests.support.checkout import fresh_clone, git, run_up, user_env
from tests.support.discovery import ServerThread, settings_for
from tests.support.http import FileServer
from tests.support.stack_config import (
    host,
    image,
    key_files,
    kvm_provider,
    placement,
    proxy,
    stack_config,
    stack_file,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]
STACK = "lab"
TOKEN = "up-after-autopilot-token"


@pytest.fixture
def image_url(tmp_path: Path) -> Iterator[str]:
    with FileServer() as server:
        yield serve(server, random_qcow2(tmp_path, data_mib=1, virtual_mib=16)).url


def pulumi_env(clone: Path, tmp_path: Path) -> dict[str, str]:
    """What scripts/up gives pulumi (docs/autopilot.md, "Running it": the
    autopilot runs with the environment `pulumi up` needs)."""
    return user_env(
        PATH=f"{clone / '.venv' / 'bin'}:{user_env()['PATH']}",
        PULUMI_HOME=str(tmp_path / "pulumi-home"),
        PULUMI_BACKEND_URL=f"file://{clone / '.pulumi-state'}",
        PULUMI_CONFIG_PASSPHRASE_FILE=str(clone / ".pulumi-state" / "passphrase"),
        PULUMI_SKIP_UPDATE_CHECK="true",
        PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true",
        **{SIMULATED_HOSTS_ENV: str(tmp_path / "hosts")},
    )


def pulumi(clone: Path, env: dict[str, str], *args: str) -> str:
    """`pulumi ARGS --stack STACK` in the clone, as scripts/up's environment runs it."""
    return subprocess.run(
        ["pulumi", *args, "--stack", STACK],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout


def config_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.timeout(900)
def test_scripts_up_after_an_autopilot_recycle_changes_nothing(
    tmp_path: Path, image_url: str
) -> None:
    clone = fresh_clone(tmp_path)
    provider = kvm_provider(
        *key_files(tmp_path), hosts=[host("nas1")], images={"d": image(image_url)}, ip_timeout=30
    )
    config = stack_config(
        [provider], [proxy("home", "home", replicas=2, where=placement(), labels={"g": "home"})]
    )
    # Any proxy a second old is due: the oldest is recycled, one a round;
    # the service probes nothing here, so no floor of healthy proxies.
    config["autopilot"] = {
        "recycle": {"maxAge": "1s", "healthyFloor": 0},
        "maxChangesPerRound": 1,
    }
    tracked = clone / f"Pulumi.{STACK}.yaml"
    tracked.write_text(yaml.safe_dump(stack_file(config), sort_keys=False))
    git(clone, "add", tracked.name)
    git(clone, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "lab")
    env = pulumi_env(clone, tmp_path)
    simulated = {SIMULATED_HOSTS_ENV: env[SIMULATED_HOSTS_ENV], "PULUMI_HOME": env["PULUMI_HOME"]}

    made = run_up(STACK, "--yes", "--skip-preview", root=clone, **simulated)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert git(clone, "status", "--porcelain") == ""
    copy = clone / ".pulumi-state" / "config" / tracked.name
    salt = config_of(copy)["encryptionsalt"]

    outputs = pulumi(clone, env, "stack", "output", "--json", "--show-secrets")
    fleet = tmp_path / "fleet.json"
    fleet.write_text(outputs)
    time.sleep(1.1)  # maxAge 1s
    settings = settings_for(tmp_path, fleet_files=(fleet,), token=TOKEN)
    with ServerThread(settings) as service:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxyinfra",
                "autopilot",
                "--once",
                "--stack",
                STACK,
                "--discovery",
                service.url,
            ],
            cwd=clone,
            env=env | {"DISCOVERY_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    changes = [
        line
        for line in map(json.loads, filter(None, done.stdout.splitlines()))
        if line["event"] == "change"
    ]
    # The oldest proxy is recycled; both were made at once, so either may be.
    [(result, proxies)] = [(c["result"], c["proxies"]) for c in changes]
    recycled = proxies[0]
    assert recycled in ("home-0", "home-1"), done.stdout
    assert (result, proxies) == ("applied", [recycled, f"{recycled}-g2"]), done.stdout
    # The project's stack file holds the recycle, and nothing of this backend.
    written = config_of(tracked)
    assert written["config"]["egress-proxies:generations"] == {recycled: 2}
    assert "encryptionsalt" not in written
    assert git(clone, "status", "--porcelain") == f" M {tracked.name}\n"

    again = run_up(STACK, "preview", "--expect-no-changes", root=clone, **simulated)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # And a whole `scripts/up` after it: the recycled proxy stays, nothing changes.
    up = run_up(STACK, "--yes", "--skip-preview", root=clone, **simulated)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    history = json.loads(pulumi(clone, env, "stack", "history", "--json"))
    # Every resource the same; a `discard` is the engine dropping what the
    # autopilot's update only read (a StackReference of the partial run).
    changed = set(history[0]["resourceChanges"]) - {"same", "discard"}
    assert not changed, up.stdout[-4000:]
    assert config_of(tracked) == written
    # One salt: the stack's own, beside its state, where scripts/up keeps it.
    assert config_of(copy)["encryptionsalt"] == salt
