"""A private sshd for tests that must kill or restart it: a copy of the
testbed's sshd config on another loopback port, started and stopped by PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
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
        self.workdir = workdir
        self.config = workdir / "sshd_config"
        self.known_hosts = workdir / "known_hosts"
        self.log = workdir / "sshd.log"
        self._testbed_config = testbed_config.read_text()
        self._testbed_known_hosts = testbed_known_hosts.read_text()
        # A port the caller chose, or one this sshd listened on once (a client
        # holds it): a restart keeps it.
        self._fixed = port is not None
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log_seen = 0  # how much of the log kill_sessions has read

    def _write(self) -> None:
        text = re.sub(r"(?m)^Port .*$", f"Port {self.port}", self._testbed_config)
        text = re.sub(r"(?m)^PidFile .*$", f"PidFile {self.workdir / 'sshd.pid'}", text)
        self.config.write_text(text)
        # Same host key as the testbed's sshd, listed under this port.
        self.known_hosts.write_text(
            re.sub(
                r"^\[127\.0\.0\.1\]:\d+",
                f"[127.0.0.1]:{self.port}",
                self._testbed_known_hosts,
                flags=re.M,
            )
        )

    def start(self) -> PrivateSshd:
        """Starts sshd and returns once it listens. Ready means its own log says
        so: a connect() alone could reach another process that took the port
        between free_port() and sshd's bind (other workers start servers too),
        and then this sshd's sessions are not the ones a test kills. A free port
        taken meanwhile is replaced by another, three times at most."""
        for _ in range(3):
            self._write()
            self.log.unlink(missing_ok=True)
            self._log_seen = 0
            # -D: the listener stays our child, so its PID is the one we stop.
            process = subprocess.Popen(
                ["/usr/sbin/sshd", "-D", "-f", str(self.config), "-E", str(self.log)]
            )
            if self._listening(process):
                self.process, self._fixed = process, True
                return self
            process.kill()
            process.wait(10)
            if self._fixed or "Address already in use" not in self._log_text():
                break
            self.port = free_port()
        raise RuntimeError(f"sshd did not listen on {self.port}: {self._log_text()}")

    def _listening(self, process: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + 10
        wanted = f"Server listening on 127.0.0.1 port {self.port}."
        while time.monotonic() < deadline and process.poll() is None:
            if wanted in self._log_text():
                return True
            time.sleep(0.05)
        return False

    def _log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()
        return ""

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
        """Kill the per-connection sshd processes (as a crash or reboot would):
        the listener's children and theirs, and the sessions' processes its log
        names ("User child is on pid N") with their parents, in case a scan of
        /proc missed them (seen twice on a loaded machine: 0 children found
        while the log showed a session). How many processes were killed."""
        assert self.process is not None
        listener = self.process.pid
        pids: list[int] = []
        for child in self._children(listener):
            pids += [*self._children(child), child]
        # Only the lines since the last kill, and only sshd processes: a PID in
        # an old line may belong to another process by now.
        text = self._log_text()
        lines, self._log_seen = text[self._log_seen :], len(text)
        for user_child in map(int, re.findall(r"User child is on pid (\d+)", lines)):
            parent = self._parent(user_child)
            session = [user_child] + ([parent] if parent not in (None, listener, 1) else [])
            pids += [pid for pid in session if self._is_sshd(pid)]
        killed = 0
        for pid in dict.fromkeys(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    @staticmethod
    def _is_sshd(pid: int) -> bool:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"
        return False

    @staticmethod
    def _parent(pid: int) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[1])
        return None

    def stop(self) -> None:
        if self.process is None:
            return
        self.kill_sessions()
        self.process.kill()
        self.process.wait(10)
        self.process = None
