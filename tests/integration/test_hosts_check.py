"""`python -m proxyinfra hosts check` against the testbed."""

from __future__ import annotations

import grp
import os
import re
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from tests.support import proxyinfra_cli
from tests.support.stack_config import stack_file, the_testbed_provider
from tests.support.testbed import Testbed

pytestmark = pytest.mark.integration


def write_stack(project: Path, testbed: Testbed, **host_changes: Any) -> None:
    provider = the_testbed_provider(testbed)
    provider["kvm"]["hosts"][0].update(host_changes)
    doc = stack_file({"providers": [provider]})
    (project / "Pulumi.check.yaml").write_text(yaml.safe_dump(doc))


def hosts_check(project: Path) -> subprocess.CompletedProcess[str]:
    return proxyinfra_cli(project, "hosts", "check", "--stack", "check")


def test_passes_on_the_testbed_and_names_the_failed_check_without_its_pool(
    testbed: Testbed, tmp_path: Path
) -> None:
    # A pool of this test's own, so removing it disturbs nothing else.
    name = f"check-{uuid.uuid4().hex[:6]}"
    target = tmp_path / "pool"
    target.mkdir()
    local = libvirt.open("qemu:///system")
    pool = local.storagePoolDefineXML(
        f"<pool type='dir'><name>{name}</name><target><path>{target}</path></target></pool>", 0
    )
    pool.create(0)
    try:
        write_stack(tmp_path, testbed, pool=name)
        done = hosts_check(tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = [re.split(r"\s{2,}", line) for line in done.stdout.splitlines() if line.strip()]
        checks = [r[1] for r in rows]
        assert checks == [
            "ssh reachable",
            "host key verified",
            "ssh key accepted",
            "libvirt socket usable",
            "storage pool",
            "memory",
            "network",
            "domain type",
            "kvm device",
            "UEFI firmware",
        ]
        assert all(
            line.split()[0] == "testbed" for line in done.stdout.splitlines() if line.strip()
        )
        assert " FAIL " not in done.stdout
        # The figure a domain create checks against: free memory and page cache.
        [memory] = [r for r in rows if r[1] == "memory"]
        assert re.fullmatch(
            r"\d+\.\d GiB for guests \(free and page cache\) of \d+\.\d GiB", memory[3]
        ), memory
    finally:
        pool.destroy()
        pool.undefine()
        local.close()
    done = hosts_check(tmp_path)
    assert done.returncode == 1
    (failed,) = [line for line in done.stdout.splitlines() if " FAIL " in line]
    assert re.split(r"\s{2,}", failed)[1:3] == ["storage pool", "FAIL"]
    assert f"pool {name!r} not found" in failed
    assert "1 check(s) failed: testbed: storage pool" in done.stdout


def test_fails_on_an_unknown_network_and_names_it(testbed: Testbed, tmp_path: Path) -> None:
    write_stack(tmp_path, testbed, network="no-such-net")
    done = hosts_check(tmp_path)
    assert done.returncode == 1
    assert "libvirt network 'no-such-net' not found" in done.stdout


@pytest.mark.testbed_alone  # /dev/kvm is the machine's
def test_names_a_kvm_device_qemu_cannot_open_and_passes_once_udev_permissions_are_back(
    testbed: Testbed, tmp_path: Path
) -> None:
    """A host without udev keeps /dev/kvm at 0600 root:root while libvirt offers
    KVM: the check fails naming the fix; `scripts/testbed up` applies that fix."""
    kvm = Path("/dev/kvm")
    assert kvm.is_char_device(), "the build machines have /dev/kvm"
    write_stack(tmp_path, testbed)
    os.chown(kvm, 0, 0)
    os.chmod(kvm, 0o600)
    try:
        done = hosts_check(tmp_path)
        assert done.returncode == 1, done.stdout
        (failed,) = [line for line in done.stdout.splitlines() if " FAIL " in line]
        assert re.split(r"\s{2,}", failed)[1:3] == ["kvm device", "FAIL"]
        assert "/dev/kvm is 600 uid 0 gid 0" in failed
        assert "chgrp kvm /dev/kvm && chmod 0660 /dev/kvm" in failed
        assert "1 check(s) failed: testbed: kvm device" in done.stdout
    finally:
        up = testbed.script("up")
    assert up.returncode == 0, up.stderr
    st = kvm.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (
        0o660,
        0,
        grp.getgrnam("kvm").gr_gid,
    )
    done = hosts_check(tmp_path)
    assert done.returncode == 0, done.stdout
    (row,) = [line for line in done.stdout.splitlines() if "kvm device" in line]
    assert "/dev/kvm is 660 uid 0 gid" in row and "usable by qemu" in row
