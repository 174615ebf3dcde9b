"""A short libvirt session against the testbed whose log the transport tests
read: `python -m tests.support.traced_session MARKER`, run with
EGRESS_PROXIES_LOG set, does a few RPCs and uploads user-data that holds
MARKER (into a volume named after it, deleted again).

A process of its own because the log level is read from the environment when
logging is configured, once per process.
"""

from __future__ import annotations

import sys

from providers.kvm.connection import HostConnection
from proxyinfra import logs
from proxyinfra.cloudinit import render_user_data
from tests.support.testbed import access_for, load_testbed


def traced_session(marker: str) -> None:
    logs.configure()
    testbed = load_testbed()
    conn = HostConnection(access_for(testbed))
    try:
        lv = conn.libvirt()
        pool = lv.storagePoolLookupByName(testbed.pool)
        pool.listAllVolumes(0)
        data = render_user_data(
            "http_port 3128\n", None, f"#cloud-config\nbootcmd: [[echo, {marker}]]\n"
        ).encode()
        vol = pool.createXML(
            f"<volume><name>trace-{marker}.raw</name><capacity>{len(data)}</capacity></volume>", 0
        )
        stream = lv.newStream(0)
        vol.upload(stream, 0, len(data), 0)
        stream.send(data)
        stream.finish()
        vol.delete(0)
    finally:
        conn.close()


if __name__ == "__main__":
    traced_session(sys.argv[1])
