"""A stack lock left by a killed `pulumi up`, through the real CLI on a
simulated kvm host: the autopilot's first look names it stale (its pid runs
no more on this host) with the operator's remedy, removes nothing and
updates nothing; the remedy as printed (`pulumi cancel --stack NAME --yes`)
clears it on the file backend, and the next round applies the change."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.baseimages import random_qcow2, serve
from tests.support.discovery import ServerThread, settings_for
from tests.support.http import FileServer
from tests.support.pulumi_cli import CliStack, freeze_run, kill_run
from tests.support.simulated_fleet import simulated_env
from tests.support.stack_config import (
    host,
    image,
    key_files,
    kvm_provider,
    placement,
    proxy,
    stack_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]
STACK = "stale"
TOKEN = "stale-lock-token"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[CliStack]:
    with FileServer() as server:
        url = serve(server, random_qcow2(tmp_path, data_mib=1, virtual_mib=16)).url
        provider = kvm_provider(
            *key_files(tmp_path), hosts=[host("nas1")], images={"d": image(url)}, ip_timeout=30
        )
        config = stack_config([provider], [proxy("home", "home", where=placement())])
        # One replica under a min of 2: a change is due whatever the signals.
        config["autopilot"] = {"scale": {"groups": {"home": {"min": 2, "max": 2}}}}
        made = CliStack(tmp_path / "stack", STACK, config, simulated_env(tmp_path / "hosts"))
        made.ok("up", "--yes", "--skip-preview")
        yield made
        made.run("cancel", "--yes")
        made.run("destroy", "--yes", "--skip-preview")


def locks(stack: CliStack) -> list[Path]:
    return [p for p in (stack.directory / "state" / ".pulumi" / "locks").rglob("*.json")]


def killed_up(stack: CliStack) -> dict[str, Any]:
    """A `pulumi up` killed once it holds the lock, as a crash ends it: its
    lock file stays, naming a pid that runs no more."""
    run = stack.start("up", "--yes", "--skip-preview")
    while not locks(stack):
        assert run.poll() is None, run.stdout.read() if run.stdout else ""
        time.sleep(0.02)
    freeze_run(run)
    kill_run(run)
    [lock] = locks(stack)
    content: dict[str, Any] = json.loads(lock.read_text())
    assert content["pid"] == run.pid
    return content


def autopilot(stack: CliStack, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "proxyinfra", "--project-dir", str(stack.directory)),
            *("autopilot", "--once", "--stack", STACK, "--discovery", url, *args),
        ],
        cwd=ROOT,
        env=stack.env() | {"DISCOVERY_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=600,
    )


def lines(done: subprocess.CompletedProcess[str], event: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [line for line in found if line["event"] == event]


@pytest.mark.timeout(600)
def test_a_killed_runs_lock_is_named_stale_with_a_remedy_that_works(
    stack: CliStack, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(stack.ok("stack", "output", "--json", "--show-secrets").stdout)
    history = stack.ok("stack", "history", "--json").stdout
    config = stack.stack_file.read_bytes()
    lock = killed_up(stack)
    with ServerThread(settings_for(tmp_path, fleet_files=(fleet,), token=TOKEN)) as service:
        done = autopilot(stack, service.url, "--lock-timeout", "3")
        [wait] = lines(done, "wait")
        assert wait["holder"].startswith(
            f"{lock['username']}@{lock['hostname']} (pid {lock['pid']})"
        )
        assert f"a stale lock (pid {lock['pid']} is not running on this host)" in wait["holder"]
        remedy = f"pulumi cancel --stack {STACK} --yes"
        assert f"`{remedy}`" in wait["holder"]
        [change] = lines(done, "change")
        assert change["result"] == "stale-lock" and done.returncode == 1
        # Nothing removed, nothing updated, the config as it was.
        assert len(locks(stack)) == 1
        assert stack.ok("stack", "history", "--json").stdout == history
        assert stack.stack_file.read_bytes() == config

        # The remedy as the line prints it, with the project's CLI on the file backend.
        cancelled = subprocess.run(
            shlex.split(remedy),
            cwd=stack.directory,
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert locks(stack) == []
        again = autopilot(stack, service.url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [c["result"] for c in lines(again, "change")] == ["applied"]
    assert lines(again, "wait") == []
