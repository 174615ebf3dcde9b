"""`pulumi up` killed with SIGKILL (while its domains boot; once its overlays
and seeds exist, before any domain; during the base image's download), then the documented recovery (docs/kvm-provider.md, "When
a run is interrupted"): `pulumi cancel --yes` (the dead run's lock), `pulumi
refresh --clear-pending-creates --yes`, then `pulumi up --yes`. What the killed run left under its fixed names is this
stack's: the new creates replace or take it over, every proxy ends up
running once, and gc finds nothing."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import libvirt
import pytest

from providers.kvm.baselock import STALE_ENV, lock_volume
from proxyinfra.names import (
    base_marker_volume,
    base_volume,
    overlay_volume,
    proxy_id,
    seed_volume,
)
from tests.support import proxyinfra_cli
from tests.support.http import FileServer
from tests.support.images import tiny_image
from tests.support.pulumi_cli import CliStack, freeze_run, kill_run
from tests.support.testbed import URI, Testbed
from tests.support.tinyfleet import ConsoleWatch, pool_volumes, tiny_fleet

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

NAMES = ("home-0", "home-1")
# One proxy where a second proves nothing more (the kill points of a boot and
# of the shared base's download): each boot is seconds of a core under TCG.
ONE = NAMES[:1]


@pytest.fixture(params=["checkpoints", "skip-checkpoints"])
def run_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The kill while domains boot and its recovery as the engine runs by
    default, and with PULUMI_SKIP_CHECKPOINTS=true (docs/kvm-provider.md: safe for kvm stacks,
    whose creates take over what a killed run left; the killed run then
    leaves no record at all of what it made)."""
    return {"PULUMI_SKIP_CHECKPOINTS": "true"} if request.param == "skip-checkpoints" else {}


def domains(conn: libvirt.virConnect) -> dict[str, str]:
    """Defined domains by name, with their UUIDs."""
    return {d.name(): d.UUIDString() for d in conn.listAllDomains(0)}


def recover(stack: CliStack) -> subprocess.CompletedProcess[str]:
    """The documented recovery after a killed `up`: `cancel` (the dead run's
    lock; an empty `.attrs` it left removed first, as scripts/up does),
    `refresh --clear-pending-creates`, then `up`."""
    stack.forget_killed_run()
    stack.ok("refresh", "--yes", "--skip-preview", "--clear-pending-creates")
    return stack.ok("up", "--yes", "--skip-preview")


def converged(stack: CliStack, names: tuple[str, ...]) -> Any:
    """Asserts the stack is the fleet of NAMES, with nothing left to
    change and nothing for gc; returns its manifest."""
    manifest = stack.output("fleet")
    assert sorted(p["name"] for p in manifest["proxies"]) == list(names)
    stack.ok("preview", "--expect-no-changes")
    gc = proxyinfra_cli(
        stack.directory, "gc", "--stack", stack.stack, "--min-age", "0", env=stack.env()
    )
    assert gc.returncode == 0 and "no orphans" in gc.stdout, gc.stdout + gc.stderr
    return manifest


def test_up_killed_while_domains_boot_recovers_with_refresh_and_up(
    testbed: Testbed, tmp_path: Path, run_env: dict[str, str]
) -> None:
    conn = libvirt.open(URI)
    with FileServer() as server:
        url = server.add(f"/{uuid.uuid4().hex[:8]}/tiny.qcow2", file=tiny_image())
        stack = CliStack(
            tmp_path / "stack",
            f"kill{uuid.uuid4().hex[:6]}",
            tiny_fleet(testbed, url, name="home", replicas=len(ONE)),
            run_env,
        )
        ids = [proxy_id("egress-proxies", stack.stack, name) for name in ONE]
        try:
            run = stack.start("up", "--yes", "--skip-preview")
            deadline = time.monotonic() + 300
            while not all(pid in domains(conn) for pid in ids):
                assert run.poll() is None, "pulumi up ended before its domains were defined"
                assert time.monotonic() < deadline, "the domains were never defined"
                time.sleep(0.2)
            killed = domains(conn)
            kill_run(run)  # pulumi, its language host, the provider
            done = recover(stack)
            assert "left by an interrupted run" in done.stdout + done.stderr
            after = domains(conn)
            for pid in ids:
                assert conn.lookupByName(pid).isActive()
                assert after[pid] != killed[pid], "the leftover was replaced, not reused blindly"
            manifest = converged(stack, ONE)
            assert all(p["host"] for p in manifest["proxies"])
        finally:
            stack.run("destroy", "--yes", "--skip-preview")
            conn.close()


def test_up_killed_once_overlays_and_seeds_exist_recovers_with_refresh_and_up(
    testbed: Testbed, tmp_path: Path
) -> None:
    """The run is frozen (SIGSTOP) the moment every proxy's overlay and seed
    is in the pool, then killed: the disks and seeds stay under their fixed
    names, recorded in the state or not. The proxies' chains run in parallel,
    so the one finished first may have its domain defined already; the last
    one's is not (the engine defines a domain after its disks, and the freeze
    comes first). The recovery takes them over or replaces them; each proxy
    ends up with one overlay, one seed and one running domain. With the
    engine's checkpoints only: without them nothing is recorded, and the
    takeover of unrecorded overlays and seeds, and of a domain beside them,
    is the kill while domains boot without checkpoints."""
    conn = libvirt.open(URI)
    with FileServer() as server:
        url = server.add(f"/{uuid.uuid4().hex[:8]}/tiny.qcow2", file=tiny_image())
        stack = CliStack(
            tmp_path / "stack",
            f"kill{uuid.uuid4().hex[:6]}",
            tiny_fleet(testbed, url, name="home", replicas=2),
        )
        ids = [proxy_id("egress-proxies", stack.stack, name) for name in NAMES]
        disks = {overlay_volume(pid) for pid in ids} | {seed_volume(pid) for pid in ids}
        try:
            run = stack.start("up", "--yes", "--skip-preview")
            deadline = time.monotonic() + 300
            # The pool's files, not libvirt's listing: a new connection and a
            # pool refresh per look took long enough, on a loaded machine, for
            # the engine to define the last domain before the freeze (seen once).
            files = [testbed.pool_path / disk for disk in disks]
            while not all(file.exists() for file in files):
                assert run.poll() is None, "pulumi up ended before its disks were made"
                assert time.monotonic() < deadline, "the overlays and seeds were never made"
                time.sleep(0.005)
            freeze_run(run)
            defined = set(domains(conn)) & set(ids)
            kill_run(run)
            assert defined < set(ids), f"every domain ({defined}) was defined before the freeze"
            assert disks <= pool_volumes(testbed)
            with ConsoleWatch(testbed, ids) as watch:
                try:
                    recover(stack)
                except AssertionError as error:
                    seen = watch.report()
                    raise AssertionError(
                        f"{error}\n--- the guests during the recovery\n{seen}"
                    ) from None
            for pid in ids:
                assert conn.lookupByName(pid).isActive()
            ours = {v for v in pool_volumes(testbed) if any(pid in v for pid in ids)}
            assert ours == disks, "one overlay and one seed per proxy, nothing else"
            converged(stack, NAMES)
        finally:
            stack.run("destroy", "--yes", "--skip-preview")
            conn.close()


def test_up_killed_during_the_base_download_recovers_with_refresh_and_up(
    testbed: Testbed, tmp_path: Path
) -> None:
    """The other kill point that leaves something half-made: the base image
    half uploaded, its lock left. The recovery's `up` takes the silent lock
    over (here after 6 s instead of 45), fetches the base again and
    converges; nothing half-written stays in use. With the engine's
    checkpoints only: at this point a checkpointed run has recorded only the
    stack, its providers and the base's pending create, which the recovery's
    refresh clears, so the recovery's `up` meets the host and the base's
    absence from the state exactly as after a run without checkpoints."""
    conn = libvirt.open(URI)
    with FileServer() as server:
        path = f"/{uuid.uuid4().hex[:8]}/tiny.qcow2"
        url = server.add(path, file=tiny_image(), rate=2 * 1024 * 1024)
        stack = CliStack(
            tmp_path / "stack",
            f"kill{uuid.uuid4().hex[:6]}",
            tiny_fleet(testbed, url, name="home", replicas=len(ONE)),
            extra_env={STALE_ENV: "6"},
        )
        volume = base_volume(url, None, "qcow2")
        ids = [proxy_id("egress-proxies", stack.stack, name) for name in ONE]
        try:
            run = stack.start("up", "--yes", "--skip-preview")
            deadline = time.monotonic() + 120
            while server.count(path) == 0 or volume not in pool_volumes(testbed):
                assert run.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(1.0)  # part of the image is in the volume
            kill_run(run)
            assert lock_volume(volume) in pool_volumes(testbed)
            assert base_marker_volume(volume) not in pool_volumes(testbed)
            done = recover(stack)
            assert "its writer is gone; taking over" in done.stdout + done.stderr
            assert server.count(path) == 2  # fetched again, not trusted half-written
            for pid in ids:
                assert conn.lookupByName(pid).isActive()
            left = pool_volumes(testbed)
            assert base_marker_volume(volume) in left and lock_volume(volume) not in left
            converged(stack, ONE)
        finally:
            stack.run("destroy", "--yes", "--skip-preview")
            conn.close()
