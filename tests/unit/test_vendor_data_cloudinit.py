"""The kvm provider's default vendor-data installs and starts the QEMU guest
agent whatever a proxy's user-data holds, judged by Debian's cloud-init itself
(tests/support/cloudinit_sandbox.py runs its init stage on the seed): its merge
of user and vendor cloud-config, and the vendor scripts it writes, which are
then run with apt-get, dpkg-query and systemctl replaced by recorders."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from providers.kvm.config import DEFAULT_VENDOR_DATA
from proxyinfra.cloudinit import render_user_data
from proxyinfra.squid import SquidSettings, password_file_line, render_squid_conf
from tests.support.cloudinit import consumed

AGENT = "qemu-guest-agent"
HASH = "$2b$04$bvm.OktaeZIpywMzu35NVear2J3xhiQSv7SKKa/COIqcpXw9b6wkm"

USER_EXTRAS = {
    "none": None,
    "runcmd": "#cloud-config\nruncmd:\n  - [touch, /var/tmp/user-was-here]\n",
    "packages": "#cloud-config\npackages: [htop]\n",
    "runcmd and packages": (
        "#cloud-config\npackages: [htop, curl]\nruncmd:\n  - [touch, /var/tmp/user-was-here]\n"
    ),
}


def recorded_run(script: str, tmp_path: Path) -> list[str]:
    """Runs a vendor script as cloud-init would (its own file, executed) on a
    machine without the agent: the package tools record what they were asked."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    for tool, status in (("apt-get", 0), ("systemctl", 0), ("dpkg-query", 1)):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexit {status}\n')
        stub.chmod(0o755)
    path = tmp_path / "vendor-script"
    path.write_text(script)
    path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run([str(path)], env=env, check=True, capture_output=True, timeout=30)
    return log.read_text().splitlines() if log.exists() else []


def agent_outcome(result: dict[str, object], tmp_path: Path) -> tuple[bool, bool]:
    """(installed, started) once cloud-init ran everything it kept."""
    packages = [str(p) for p in result["packages"]]  # type: ignore[attr-defined]
    runcmd = [" ".join(map(str, c)) if isinstance(c, list) else str(c) for c in result["runcmd"]]  # type: ignore[attr-defined]
    installed = AGENT in packages
    started = any(AGENT in cmd and ("start" in cmd or "--now" in cmd) for cmd in runcmd)
    scripts: dict[str, str] = result["vendor_scripts"]  # type: ignore[assignment]
    for script in scripts.values():
        calls = recorded_run(script, tmp_path)
        installed |= any(c.startswith("apt-get install") and AGENT in c for c in calls)
        started |= f"systemctl start {AGENT}" in calls
    return installed, started


@pytest.mark.parametrize("extra", list(USER_EXTRAS))
def test_the_default_vendor_data_installs_and_starts_the_agent(extra: str, tmp_path: Path) -> None:
    settings = SquidSettings(allowed_clients=("10.0.0.0/8",), auth_username="crawler")
    squid_conf = render_squid_conf(settings)
    user_data = render_user_data(
        squid_conf, password_file_line("crawler", HASH), USER_EXTRAS[extra], hostname="p0"
    )
    result = consumed(user_data, DEFAULT_VENDOR_DATA)
    assert agent_outcome(result, tmp_path) == (True, True), result
    # The user's own wishes survive beside it.
    if "packages" in extra:
        assert "htop" in result["packages"]
    if "runcmd" in extra:
        assert any("user-was-here" in str(c) for c in result["runcmd"])


def test_a_cloud_config_vendor_data_loses_the_agent_to_any_user_runcmd(tmp_path: Path) -> None:
    """Why the default is a script: cloud-init's merge gives user-data's
    `runcmd` and `packages` precedence over vendor-data's, wholesale."""
    old_default = (
        "#cloud-config\npackages:\n  - qemu-guest-agent\n"
        "runcmd:\n  - [systemctl, enable, --now, qemu-guest-agent]\n"
    )
    user_data = "#cloud-config\npackages: [squid]\nruncmd:\n  - [systemctl, restart, squid]\n"
    result = consumed(user_data, old_default)
    assert agent_outcome(result, tmp_path) == (False, False), result
