"""Two stacks that need the same base image on one host at once, through the
real Pulumi CLI on the testbed: exactly one downloads it, the other waits
and uses it; a downloader killed half way leaves a lock and half a volume,
which the next stack recognises as abandoned and fetches again
(providers/kvm/baselock.py)."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from providers.kvm.baselock import STALE_ENV, lock_volume
from proxyinfra.names import base_marker_volume, base_volume, proxy_id
from tests.support.http import FileServer
from tests.support.images import tiny_image
from tests.support.pulumi_cli import CliStack, kill_run
from tests.support.testbed import URI, Testbed
from tests.support.tinyfleet import pool_volumes, tiny_fleet

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

RATE = 3 * 1024 * 1024  # bytes/s: the tiny image takes a few seconds to serve
STALE = "6"  # seconds of silence after which a lock counts as abandoned


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FileServer, str, str]]:
    with FileServer() as server:
        # A path of its own: the base volume is named by URL, so no earlier
        # test's cached base serves it.
        path = f"/{uuid.uuid4().hex[:8]}/tiny.qcow2"
        yield server, server.add(path, file=tiny_image(), rate=RATE), path


def stacks(directory: Path, testbed: Testbed, url: str, count: int) -> list[CliStack]:
    tag = uuid.uuid4().hex[:6]
    return [
        CliStack(
            directory / f"s{i}",
            f"base{tag}{i}",
            tiny_fleet(testbed, url),
            extra_env={STALE_ENV: STALE},
        )
        for i in range(count)
    ]


def running(testbed: Testbed, stack: CliStack) -> bool:
    conn = libvirt.open(URI)
    try:
        return bool(conn.lookupByName(proxy_id("egress-proxies", stack.stack, "solo-0")).isActive())
    finally:
        conn.close()


def test_two_ups_at_once_download_the_base_once(
    testbed: Testbed, served: tuple[FileServer, str, str], tmp_path: Path
) -> None:
    server, url, path = served
    first, second = stacks(tmp_path, testbed, url, 2)
    results: list[subprocess.CompletedProcess[str]] = []

    def up(stack: CliStack) -> None:
        results.append(stack.run("up", "--yes", "--skip-preview"))

    threads = [threading.Thread(target=up, args=(s,)) for s in (first, second)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=900)
        assert [r.returncode for r in results] == [0, 0], [r.stdout[-3000:] for r in results]
        assert server.count(path) == 1  # one download for both
        both = "\n".join(r.stdout + r.stderr for r in results)
        assert "another writer is fetching this base image" in both
        assert running(testbed, first) and running(testbed, second)
        volume = base_volume(url, None, "qcow2")
        assert {volume, base_marker_volume(volume)} <= pool_volumes(testbed)
        assert lock_volume(volume) not in pool_volumes(testbed)
    finally:
        for stack in (first, second):
            stack.run("destroy", "--yes", "--skip-preview")


def test_a_killed_downloader_s_half_base_is_fetched_again(
    testbed: Testbed, served: tuple[FileServer, str, str], tmp_path: Path
) -> None:
    server, url, path = served
    killed, next_one = stacks(tmp_path, testbed, url, 2)
    volume = base_volume(url, None, "qcow2")
    try:
        process = killed.start("up", "--yes", "--skip-preview")
        deadline = time.monotonic() + 120
        while lock_volume(volume) not in pool_volumes(testbed):
            assert time.monotonic() < deadline, "the download never started"
            assert process.poll() is None
            time.sleep(0.2)
        time.sleep(1.0)  # part of the image is in the volume
        kill_run(process)  # pulumi, its language host, the provider
        left = pool_volumes(testbed)
        assert lock_volume(volume) in left and base_marker_volume(volume) not in left
        done = next_one.ok("up", "--yes", "--skip-preview")
        assert "its writer is gone; taking over" in done.stdout + done.stderr
        assert server.count(path) == 2  # the killed one's, and this
        assert running(testbed, next_one)
        left = pool_volumes(testbed)
        assert base_marker_volume(volume) in left and lock_volume(volume) not in left
    finally:
        next_one.run("destroy", "--yes", "--skip-preview")
        # The killed run left the file backend's lock and a pending create.
        killed.forget_killed_run()
        killed.run("refresh", "--yes", "--skip-preview", "--clear-pending-creates")
        killed.run("destroy", "--yes", "--skip-preview")
