"""A GCP proxy on an image with cloud-init (Ubuntu's): its `user-data`
metadata key run by a real cloud-init, in a guest of namespaces
(tests/support/gce_guest.py) against a metadata server on loopback
(tests/support/gce_metadata.py).

Debian's cloud-init reads the metadata through its GCE datasource, as
Ubuntu's images do, and runs its three stages with the modules the proxy's
user-data uses, in Ubuntu's order: the hostname, the agent and its unit
(deferred files), then one runcmd line that installs squid when missing,
applies squid's files from their own keys and starts squid and the agent.
The startup-script path of Debian's images is tests/integration/
test_gcp_squid_sync.py; what both must do is the same, so the same things
are asserted.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace

import pytest
import yaml

from providers.gcp.bootstrap import OS_LOGIN, USER_DATA_KEY, render_user_data
from providers.gcp.squid_sync import (
    GUEST_ATTRIBUTES,
    squid_metadata,
)
from proxyinfra.squid import render_squid_conf
from tests.support.gce_guest import Guest
from tests.support.gce_metadata import MetadataServer
from tests.support.gce_proxy import (
    BOOT_CALLS,
    BOOT_FILES,
    file_modes,
    passwords_of,
    settings,
    status,
    wait_for,
    wait_reported,
)
from tests.support.squid import EchoServer, free_port

pytestmark = pytest.mark.integration

HOSTNAME = "proxy-5e0c1d2a3b"
# The operator's own userData, merged into the proxy's by the stack.
OPERATORS = "#cloud-config\n" + yaml.safe_dump(
    {
        "write_files": [{"path": "/etc/squid/operator-note", "content": "kept by ops\n"}],
        "runcmd": ["touch /run/operator-runcmd-ran"],
    }
)
BOOT_TIMEOUT_S = 120.0  # cloud-init's three stages, each a Python start


def metadata(squid_conf: str, passwords: str | None, user_data: str | None) -> dict[str, str]:
    """An instance's metadata as providers/gcp/bootstrap.py makes it for a
    cloud-init image."""
    return {
        **OS_LOGIN,
        **GUEST_ATTRIBUTES,
        USER_DATA_KEY: render_user_data(user_data, HOSTNAME),
        **squid_metadata(squid_conf, passwords),
    }


def test_cloud_init_brings_up_squid_and_the_agent_from_user_data(
    gce_server: MetadataServer, echo: EchoServer
) -> None:
    port = free_port()
    first = settings(port)
    passwords = passwords_of("first-pass")
    gce_server.set(metadata(render_squid_conf(first), passwords, OPERATORS))
    with closing(Guest.cloud_init(gce_server.host)) as guest:
        assert guest.boot_status(BOOT_TIMEOUT_S) == 0, guest.log("cloud-init-output.log")
        # The same boot as the startup script's: files, squid restarted on them, the agent.
        assert guest.systemctl_calls() == BOOT_CALLS
        assert file_modes(guest, *BOOT_FILES) == BOOT_FILES
        assert guest.read("/etc/squid/squid.conf") == render_squid_conf(first)
        assert guest.read("/etc/squid/passwords") == passwords
        assert guest.run("hostname").stdout.strip() == HOSTNAME
        assert guest.read("/etc/hostname") == f"{HOSTNAME}\n"
        # The operator's own cloud-config ran beside the proxy's.
        assert guest.read("/etc/squid/operator-note") == "kept by ops\n"
        assert guest.read("/run/operator-runcmd-ran") == ""
        wait_for("squid serving", lambda: status(port, echo, "first-pass") == 200, guest)
        assert status(port, echo, None) == 407
        pid = guest.squid_pid()
        assert pid is not None

        # The agent cloud-init started takes a change in place: the same squid.
        narrowed = replace(first, connect_ports=("443",))
        gce_server.set(metadata(render_squid_conf(narrowed), passwords, OPERATORS))
        wait_for("ports narrowed", lambda: status(port, echo, "first-pass") == 403, guest)
        assert guest.squid_pid() == pid
        wait_reported(gce_server, render_squid_conf(narrowed), passwords, guest)


def test_a_cloud_init_boot_on_a_config_squid_refuses_stops_before_squid(
    gce_server: MetadataServer,
) -> None:
    broken = "bogus_directive on\n"
    gce_server.set(metadata(broken, None, None))
    with closing(Guest.cloud_init(gce_server.host)) as guest:
        # cloud-init's final stage fails on the runcmd script, and says why.
        assert guest.boot_status(BOOT_TIMEOUT_S) != 0
        output = guest.log("cloud-init-output.log")
        assert "bogus_directive" in output, output
        assert guest.systemctl_calls() == []  # squid never started on it
        assert guest.read("/etc/squid/squid.conf") is None
        assert "bogus_directive" in (gce_server.guest_attribute("egress-proxies/squid-error") or "")
