"""A base image's bytes ride OpenSSH's own forward (providers/kvm/openssh.py),
through the engine's gRPC path against the testbed: the ssh process the
provider starts, its options, its end with the upload or with a killed
provider, and the paramiko fallback when OpenSSH cannot make the forward."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from providers.kvm.access import HostAccess
from providers.kvm.baselock import lock_volume
from tests.harness.engine import ProviderProcess
from tests.support.baseimages import (
    URN,
    LogWindow,
    create,
    inputs,
    names_of,
    random_raw,
    serve,
    sha256_of,
)
from tests.support.discovery import wait_for
from tests.support.http import FileServer
from tests.support.pulumi_cli import descendants
from tests.support.testbed import Testbed

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


def ssh_children(pid: int) -> dict[int, list[str]]:
    """The ssh processes below `pid`, with their argument vectors."""
    found: dict[int, list[str]] = {}
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"ssh":
            found[child] = [a.decode() for a in argv]
    return found


def in_background(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as error:
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_the_upload_rides_an_openssh_forward_that_ends_with_it(
    testbed: Testbed, server: FileServer, access: HostAccess, made: list[str], tmp_path: Path
) -> None:
    image = serve(server, random_raw(tmp_path, 6), rate=2 * MIB)  # a 3 s download
    props = inputs(access, image.url, image.digest, "raw")
    with ProviderProcess(env={"EGRESS_PROXIES_LOG": "debug"}, rpc_timeout=120) as engine:
        assert engine.pid is not None
        log = LogWindow(engine)
        thread, box = in_background(lambda: create(engine, props, made))
        seen: dict[int, list[str]] = {}
        wait_for(lambda: seen.update(ssh_children(engine.pid or 0)) or bool(seen), timeout=30)
        ((pid, argv),) = seen.items()
        assert argv[1:3] == ["-F", "/dev/null"]  # no ssh_config decides where it goes
        assert "StrictHostKeyChecking=yes" in argv
        assert f"UserKnownHostsFile={access.known_hosts_file}" in argv
        assert argv[argv.index("-i") + 1] == access.key_file
        forward = argv[argv.index("-L") + 1]
        assert forward.endswith(f":{access.socket}")
        assert oct(os.stat(os.path.dirname(forward.split(":")[0])).st_mode & 0o777) == "0o700"
        assert argv[-4:] == ["-l", access.user, "--", access.address]
        thread.join(timeout=120)
        assert "error" not in box, box.get("error")
        outs = box["result"]
        assert outs["digest"] == image.digest
        assert sha256_of(testbed.pool_path / props["volume"]) == image.digest
        wait_for(lambda: gone(pid), timeout=10)  # the forward ended with the upload
        assert not ssh_children(engine.pid)
        assert "OpenSSH forward not available" not in log.text
        engine.delete(props["volume"], URN, outs)


def test_a_killed_provider_leaves_no_ssh_behind(
    testbed: Testbed, server: FileServer, access: HostAccess, made: list[str], tmp_path: Path
) -> None:
    image = serve(server, random_raw(tmp_path, 20), rate=2 * MIB)  # a 10 s download
    props = inputs(access, image.url, image.digest, "raw")
    made.append(lock_volume(props["volume"]))
    with ProviderProcess(rpc_timeout=60) as engine:
        assert engine.pid is not None
        provider = engine.pid
        in_background(lambda: create(engine, props, made))
        seen: dict[int, list[str]] = {}
        wait_for(lambda: seen.update(ssh_children(provider)) or bool(seen), timeout=30)
        os.kill(provider, signal.SIGKILL)
        wait_for(lambda: all(gone(pid) for pid in seen), timeout=10)  # parent-death signal
    for argv in seen.values():  # what a killed provider cannot remove (docs: known gaps)
        shutil.rmtree(os.path.dirname(argv[argv.index("-L") + 1].split(":")[0]))


def test_without_openssh_the_upload_goes_through_paramiko_and_says_so_once(
    testbed: Testbed, server: FileServer, access: HostAccess, made: list[str], tmp_path: Path
) -> None:
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "ssh").write_text("#!/bin/sh\necho 'ssh: this ssh cannot forward' >&2\nexit 255\n")
    (broken / "ssh").chmod(0o755)
    env = {"EGRESS_PROXIES_LOG": "debug", "PATH": f"{broken}:{os.environ['PATH']}"}
    with ProviderProcess(env=env, rpc_timeout=120) as engine:
        log = LogWindow(engine)
        for _ in range(2):
            image = serve(server, random_raw(tmp_path, 4))
            props = inputs(access, image.url, image.digest, "raw")
            outs = create(engine, props, made)
            assert outs["digest"] == image.digest
            assert sha256_of(testbed.pool_path / names_of(props)[0]) == image.digest
            engine.delete(props["volume"], URN, outs)
        warnings = [line for line in log.text.splitlines() if "OpenSSH forward not" in line]
        assert len(warnings) == 1, warnings  # once per host, not per upload
        assert "ssh exited with 255: ssh: this ssh cannot forward" in warnings[0]
        assert "host=testbed" in warnings[0]
