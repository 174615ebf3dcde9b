"""A GCP proxy VM's boot, run on this machine in namespaces of its own.

The startup script runs as Google's guest agent runs it (root, bash, at
boot), against a metadata server on loopback (GCE_METADATA_HOST, the
variable Google's own clients honour), in a mount and PID namespace whose
/etc/squid, /run, /usr/local/sbin, /etc/systemd/system, squid's log and
spool directories and /dev/shm are empty tmpfs, so the script writes its
real paths and the real squid runs as on the VM. Only systemd is missing:
`systemctl` is a stub that logs each call and does what systemd would for
the two services (squid started as a daemon; the squid-sync agent started in
the background). Closing kills the whole PID namespace (unshare's
--kill-child), so nothing the guest started outlives it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

EMPTY_DIRS = (
    "/etc/squid",
    "/run",
    "/usr/local/sbin",
    "/etc/systemd/system",
    "/var/log/squid",
    "/var/spool/squid",
    "/dev/shm",
)
SQUID_OWNED = ("/var/log/squid", "/var/spool/squid")
# --kill-child: when unshare ends, its child (the namespace's init) is killed,
# and with it every process of the PID namespace.
UNSHARE = (
    *("unshare", "--mount", "--propagation", "private"),
    *("--pid", "--fork", "--mount-proc", "--kill-child"),
)

_SYSTEMCTL = """\
#!/bin/bash
# systemd's part for this guest: log the call, act for squid and the agent.
echo "$*" >>{root}/systemctl.log
case "$*" in
  "restart squid")
    if [ -f /run/squid.pid ] && kill -0 "$(cat /run/squid.pid)" 2>/dev/null; then
      squid -k shutdown -f /etc/squid/squid.conf
      while kill -0 "$(cat /run/squid.pid 2>/dev/null)" 2>/dev/null; do sleep 0.1; done
    fi
    squid -f /etc/squid/squid.conf
    ;;
  "enable --now egress-proxies-squid-sync.service")
    setsid /usr/local/sbin/egress-proxies-squid-sync --watch >>{root}/agent.log 2>&1 </dev/null &
    ;;
esac
"""

_INIT = """\
set -u
for dir in {dirs}; do mount -t tmpfs -o mode=0755 tmpfs "$dir"; done
chmod 1777 /dev/shm
chown proxy:proxy {squid_owned}
rc=0
GCE_METADATA_HOST={host} PATH={root}/bin:$PATH bash {root}/startup.sh \
  >{root}/startup.log 2>&1 || rc=$?
echo "$rc" >{root}/boot.rc
exec sleep infinity
"""


class Guest:
    """One boot of a startup script; `run` runs a command inside the guest.
    Use it with `contextlib.closing`."""

    def __init__(self, startup_script: str, metadata_host: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="egress-gce-guest-"))
        (self.root / "bin").mkdir()
        systemctl = self.root / "bin" / "systemctl"
        systemctl.write_text(_SYSTEMCTL.format(root=self.root))
        systemctl.chmod(0o755)
        (self.root / "startup.sh").write_text(startup_script)
        init = _INIT.format(
            dirs=" ".join(EMPTY_DIRS),
            squid_owned=" ".join(SQUID_OWNED),
            host=metadata_host,
            root=self.root,
        )
        self._unshare = subprocess.Popen(
            [*UNSHARE, "bash", "-c", init],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def boot_status(self, timeout: float = 60.0) -> int:
        """The startup script's exit status, once it has ended."""
        deadline = time.monotonic() + timeout
        rc = self.root / "boot.rc"
        while not rc.exists() or not rc.read_text().strip():
            if self._unshare.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the guest's startup script did not end:\n{self.log()}")
            time.sleep(0.05)
        return int(rc.read_text())

    def log(self, name: str = "startup.log") -> str:
        path = self.root / name
        return path.read_text(errors="replace") if path.exists() else ""

    def systemctl_calls(self) -> list[str]:
        return self.log("systemctl.log").splitlines()

    def _init_pid(self) -> int:
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
        return int(children.read_text().split()[0])

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """A command in the guest's mount and PID namespaces."""
        return subprocess.run(
            ["nsenter", "--target", str(self._init_pid()), "--mount", "--pid", "--", *command],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def read(self, path: str) -> str | None:
        """A file of the guest (None when it has none)."""
        result = self.run("cat", path)
        return result.stdout if result.returncode == 0 else None

    def squid_pid(self) -> int | None:
        text = self.read("/run/squid.pid")
        return int(text) if text and text.strip() else None

    def close(self) -> None:
        # unshare ignores SIGTERM while it waits for its child; killed, it
        # takes the child with it (--kill-child), and the namespace with that.
        self._unshare.kill()
        self._unshare.wait()
        shutil.rmtree(self.root, ignore_errors=True)
