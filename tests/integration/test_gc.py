"""`python -m proxyinfra gc` finds planted orphans (and, with --bases, unused
cached base images) on the testbed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import libvirt
import pytest
import yaml

from providers.kvm.domainxml import DomainSpec, ProxyMetadata, build_domain_xml
from providers.kvm.volumes import lookup_volume, volume_xml
from proxyinfra.names import base_marker_volume, overlay_volume, proxy_id, seed_volume
from tests.support import proxyinfra_cli
from tests.support.stack_config import (
    image,
    machine_type,
    placement,
    proxy,
    squid,
    stack_config,
    stack_file,
    the_testbed_provider,
)
from tests.support.testbed import Testbed, refresh_pool

pytestmark = pytest.mark.integration
PROJECT = "egress-proxies"


def define(conn: libvirt.virConnect, testbed: Testbed, stack: str, logical: str) -> str:
    pid = proxy_id(PROJECT, stack, logical)
    spec = DomainSpec(
        name=pid,
        memory_mib=128,
        vcpus=1,
        domain_type="qemu",
        cpu_mode="maximum",
        disk_path=f"{testbed.pool_path}/{overlay_volume(pid)}",
        seed_path=f"{testbed.pool_path}/{seed_volume(pid)}",
        network=testbed.network,
        metadata=ProxyMetadata(
            project=PROJECT, stack=stack, name=logical, created=datetime.now(UTC)
        ),
    )
    conn.defineXML(build_domain_xml(spec))
    return pid


@pytest.fixture
def planted(testbed: Testbed, tmp_path: Path) -> Iterator[dict[str, str]]:
    stack = f"gc{uuid.uuid4().hex[:6]}"
    conn = libvirt.open("qemu:///system")
    pool = conn.storagePoolLookupByName(testbed.pool)
    made: dict[str, str] = {
        "orphan_domain": define(conn, testbed, stack, "home-0"),  # in config, not in state
        "owned_domain": define(conn, testbed, stack, "home-2"),  # in state
        "other_stack_domain": define(conn, testbed, stack + "x", "home-0"),
        "stack": stack,
    }
    orphan_vol = overlay_volume(proxy_id(PROJECT, stack, "home-1"))  # no domain at all
    other_vol = overlay_volume(proxy_id(PROJECT, stack + "x", "home-1"))  # another stack's
    for name in (orphan_vol, other_vol):
        pool.createXML(volume_xml(name, 1024 * 1024, "qcow2"), 0)
    made |= {"orphan_volume": orphan_vol, "other_volume": other_vol, "pool": testbed.pool}
    provider = the_testbed_provider(
        testbed,
        images={"tiny": image("http://127.0.0.1:9/tiny.qcow2")},
        machine_types={"small": machine_type(1, 256)},
    )
    home = proxy("home", provider["name"], replicas=3, where=placement("small", "tiny"))
    config = stack_config([provider], [home], squid("10.251.77.0/24"))
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(stack_file(config)))
    state = {"resources": [{"outputs": {"name": made["owned_domain"], "logicalName": "home-2"}}]}
    (tmp_path / "state.json").write_text(json.dumps(state))
    try:
        yield made
    finally:
        for key in ("orphan_domain", "owned_domain", "other_stack_domain"):
            with contextlib.suppress(libvirt.libvirtError):  # the orphan is gone already
                conn.lookupByName(made[key]).undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        for name in (orphan_vol, other_vol):
            vol = lookup_volume(pool, name)
            if vol is not None:
                vol.delete(0)
        conn.close()


def gc(project: Path, stack: str, *args: str) -> subprocess.CompletedProcess[str]:
    return proxyinfra_cli(
        project, "gc", "--stack", stack, "--state", str(project / "state.json"), *args
    )


def test_gc_lists_then_deletes_only_this_stacks_orphans(
    planted: dict[str, str], tmp_path: Path
) -> None:
    conn = libvirt.open("qemu:///system")
    try:
        young = gc(tmp_path, planted["stack"])  # default --min-age 1h: all of them are fresh
        assert young.returncode == 0, young.stderr
        assert "no orphans" in young.stdout

        # Qualified, as the CLI takes it: the same stack, its marks and ids by the short name.
        dry = gc(tmp_path, f"organization/{PROJECT}/{planted['stack']}", "--min-age", "0")
        assert dry.returncode == 0, dry.stderr
        listed = dry.stdout
        assert planted["orphan_domain"] in listed and planted["orphan_volume"] in listed
        for kept in ("owned_domain", "other_stack_domain", "other_volume"):
            assert planted[kept] not in listed
        assert "dry run: 2 object(s) would be removed" in listed
        names = [d.name() for d in conn.listAllDomains(0)]
        assert planted["orphan_domain"] in names  # nothing removed without --delete

        done = gc(tmp_path, planted["stack"], "--min-age", "0", "--delete")
        assert done.returncode == 0, done.stderr
        assert "removed 2 object(s)" in done.stdout
        names = [d.name() for d in conn.listAllDomains(0)]
        assert planted["orphan_domain"] not in names
        assert planted["owned_domain"] in names and planted["other_stack_domain"] in names
        pool = conn.storagePoolLookupByName(planted["pool"])
        vols = [v.name() for v in pool.listAllVolumes(0)]
        assert planted["orphan_volume"] not in vols and planted["other_volume"] in vols
    finally:
        conn.close()


def test_gc_refuses_without_readable_state(planted: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "state.json").unlink()
    done = proxyinfra_cli(
        tmp_path,
        "gc",
        "--stack",
        planted["stack"],
        "--delete",
        "--min-age",
        "0",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "cannot read the state of stack" in done.stderr


def test_gc_bases_removes_only_old_cached_bases_nothing_uses(
    planted: dict[str, str], testbed: Testbed, tmp_path: Path
) -> None:
    conn = libvirt.open("qemu:///system")
    pool = conn.storagePoolLookupByName(testbed.pool)
    tag = uuid.uuid4().hex[:12]
    unused, in_use, owned, fresh = (f"egress-base-{tag}{i:04x}.qcow2" for i in range(4))
    overlay = f"gc-test-{tag}.qcow2"
    made = [unused, base_marker_volume(unused), in_use, owned, fresh]
    try:
        for name in made:
            pool.createXML(volume_xml(name, 1024 * 1024, "qcow2"), 0)
        base_path = f"{testbed.pool_path}/{in_use}"
        pool.createXML(volume_xml(overlay, 1024 * 1024, "qcow2", (base_path, "qcow2")), 0)
        made.append(overlay)
        two_days_ago = time.time() - 2 * 86400
        for name in made:
            if name != fresh:
                os.utime(Path(testbed.pool_path, name), (two_days_ago, two_days_ago))
        state = json.loads((tmp_path / "state.json").read_text())
        state["resources"].append({"outputs": {"volume": owned}})
        (tmp_path / "state.json").write_text(json.dumps(state))

        plain = gc(tmp_path, planted["stack"], "--min-age", "1d")
        assert plain.returncode == 0, plain.stderr
        assert tag not in plain.stdout  # bases only when asked for

        dry = gc(tmp_path, planted["stack"], "--min-age", "1d", "--bases")
        assert dry.returncode == 0, dry.stderr
        listed = [line for line in dry.stdout.splitlines() if tag in line]
        assert [line.split()[2] for line in listed] == [base_marker_volume(unused), unused]
        assert "nothing backs onto it" in listed[1]

        done = gc(tmp_path, planted["stack"], "--min-age", "1d", "--bases", "--delete")
        assert done.returncode == 0, done.stderr
        refresh_pool(pool)
        left = {v.name() for v in pool.listAllVolumes(0)}
        assert not {unused, base_marker_volume(unused)} & left
        assert {in_use, owned, fresh, overlay} <= left
    finally:
        for name in reversed(made):
            vol = lookup_volume(pool, name)
            if vol is not None:
                vol.delete(0)
        conn.close()
