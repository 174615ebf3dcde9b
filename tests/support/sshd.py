"""A private sshd for tests that must kill or restart it: a copy of the
testbed's sshd config on another loopback port, started and stopped by PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.squid import free_port


class PrivateSshd:
    def __init__(
        self,
        testbed_config: Path,
        testbed_known_hosts: Path,
        workdir: Path,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.config = workdir / "sshd_config"
        text = testbed_config.read_text()
        text = re.sub(r"(?m)^Port .*$", f"Port {self.port}", text)
        text = re.sub(r"(?m)^PidFile .*$", f"PidFile {workdir / 'sshd.pid'}", text)
        self.config.write_text(text)
        # Same host key as the testbed's sshd, listed under this port.
        self.known_hosts = workdir / "known_hosts"
        self.known_hosts.write_text(
            re.sub(
                r"^\[127\.0\.0\.1\]:\d+",
                f"[127.0.0.1]:{self.port}",
                testbed_known_hosts.read_text(),
                flags=re.M,
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateSshd:
        # -D: the listener stays our child, so its PID is the one we stop.
        self.process = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-f", str(self.config), "-E", str(self.workdir / "sshd.log")]
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return self
            time.sleep(0.05)
        raise RuntimeError(
            f"sshd did not listen on {self.port}: {(self.workdir / 'sshd.log').read_text()}"
        )

    def _children(self, pid: int) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    found.append(int(entry.name))
        return found

    def kill_sessions(self) -> int:
        """Kill the per-connection sshd processes (as a crash or reboot would)."""
        assert self.process is not None
        killed = 0
        for child in self._children(self.process.pid):
            for grandchild in self._children(child):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(grandchild, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
                killed += 1
        return killed

    def stop(self) -> None:
        if self.process is None:
            return
        self.kill_sessions()
        self.process.kill()
        self.process.wait(10)
        self.process = None
