"""The autopilot on a stack it cannot open, through the real Pulumi CLI: it
says why in one line (the CLI's own error, or that the CLI cannot run), logs
the round as an error, exits 1 with no traceback, and leaves nothing in the
backend (the one-per-stack lock is taken only once the stack opened)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.autopilot_cli import autopilot_argv
from tests.support.pulumi_cli import CliStack

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]


@pytest.fixture
def stack(tmp_path: Path) -> CliStack:
    return CliStack(tmp_path / "project", "real", {})


ONCE = ("--discovery", "http://127.0.0.1:9", "--once")  # no service there: never reached


def _autopilot(
    stack: CliStack, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = autopilot_argv(stack.directory, *args)
    env = stack.env() if env is None else env
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _backend(stack: CliStack) -> list[str]:
    state = stack.directory / "state"
    return sorted(str(p.relative_to(state)) for p in state.rglob("*"))


def test_a_stack_that_does_not_exist_is_named_by_the_cli_s_error(stack: CliStack) -> None:
    before = _backend(stack)
    done = _autopilot(stack, "--stack", "nosuch", *ONCE)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "autopilot: stack 'nosuch': no stack named 'nosuch' found\n"
    [line] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (line["event"], line["result"]) == ("round", "error")
    assert line["error"] == "stack 'nosuch': no stack named 'nosuch' found"
    assert _backend(stack) == before  # no lock, no round state


def test_without_the_pulumi_cli_it_says_so(stack: CliStack) -> None:
    env = stack.env() | {"PATH": "/usr/bin:/bin"}  # the project's pulumi is in .venv/bin
    done = _autopilot(stack, "--stack", "real", *ONCE, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("autopilot: cannot run the pulumi CLI: "), done.stderr
    assert "'pulumi'" in done.stderr and "Traceback" not in done.stderr


def test_a_backend_named_only_in_pulumi_yaml_is_the_one_it_keeps_its_files_in(
    stack: CliStack,
) -> None:
    """As the CLI does, the project's `backend.url` is the backend when the
    variable is not set: the round state and lock go beside that state, not
    into the project directory (the stack has no policy: the round says so)."""
    project = stack.directory / "Pulumi.yaml"
    project.write_text(project.read_text() + "backend:\n  url: file://./state\n")
    env = {k: v for k, v in stack.env().items() if k != "PULUMI_BACKEND_URL"}
    done = _autopilot(stack, "--stack", "real", *ONCE, env=env)
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (line["event"], line["result"]) == ("round", "no-policy")
    assert "autopilot/egress-proxies/real.lock" in _backend(stack)
    assert not (stack.directory / ".autopilot").exists()


def test_a_stack_file_in_the_project_s_stack_config_dir_is_the_one_it_reads(
    stack: CliStack,
) -> None:
    """Pulumi.yaml's `stackConfigDir` moves every stack's file, for the CLI and
    so for the autopilot: a policy there is the stack's (here, a bad one,
    named by its path as the stack's config validation names it)."""
    project = stack.directory / "Pulumi.yaml"
    project.write_text(project.read_text() + "stackConfigDir: conf\n")
    (stack.directory / "conf").mkdir()
    moved = stack.directory / "conf" / stack.stack_file.name
    stack.stack_file.rename(moved)
    document = yaml.safe_load(moved.read_text()) or {}  # its salt kept
    document["config"] = {"egress-proxies:autopilot": {"maxChangesPerRound": 0}}
    moved.write_text(yaml.safe_dump(document))
    assert "maxChangesPerRound" in stack.ok("config").stdout  # the CLI reads it there
    done = _autopilot(stack, "--stack", "real", *ONCE)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "autopilot.maxChangesPerRound" in done.stderr, done.stderr


def test_a_status_address_already_taken_is_named(stack: CliStack) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = _autopilot(stack, "--stack", "real", *ONCE, "--listen", address)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"autopilot: --listen '{address}': Address already in use\n"


def test_pause_of_a_stack_the_file_backend_does_not_hold_is_refused(stack: CliStack) -> None:
    """A typo would pause nothing while saying it had: on a file backend the
    stack is looked up (its checkpoint files, as the CLI lays them out)."""
    before = _backend(stack)
    done = _autopilot(stack, "pause", "--stack", "reel")
    assert done.returncode == 2, done.stderr
    state = stack.directory / "state"
    assert done.stderr == (
        f"autopilot: --stack 'reel': no such stack in {state} (its stacks: real)\n"
    )
    assert _backend(stack) == before
    other = _autopilot(stack, "pause", "--stack", "organization/other/real")
    assert (other.returncode, other.stderr) == (
        2,
        "autopilot: --stack 'organization/other/real': names project 'other', "
        "but this project is 'egress-proxies'\n",
    )
    assert _backend(stack) == before
    # One stack, plain or qualified: one pause file, where the backend keeps the stack's files.
    assert _autopilot(stack, "pause", "--stack", "real").returncode == 0
    paused = set(_backend(stack)) - set(before) - {"autopilot", "autopilot/egress-proxies"}
    assert paused == {"autopilot/egress-proxies/real.paused"}
    qualified = _autopilot(stack, "resume", "--stack", "organization/egress-proxies/real")
    assert qualified.stdout == "autopilot resumed for stack organization/egress-proxies/real\n"
    assert "autopilot/egress-proxies/real.paused" not in _backend(stack)
