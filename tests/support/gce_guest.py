"""A GCP proxy VM's boot, run on this machine in namespaces of its own.

Either boot data of providers/gcp/bootstrap.py runs, against a metadata
server on loopback (GCE_METADATA_HOST, the variable Google's own clients
honour):

- the startup script, as Google's guest agent runs it on Debian's images
  (root, bash, at boot): `Guest(script, host)`;
- the `user-data` key, as Ubuntu's images run it: Debian's cloud-init, its
  GCE datasource reading the metadata server, its three stages with the
  modules that user-data uses in Ubuntu's order: `Guest.cloud_init(host)`.

It runs in a mount, PID and UTS namespace whose /etc/squid, /run,
/usr/local/sbin, /etc/systemd/system, /etc/cloud, squid's log and spool
directories and /dev/shm are empty tmpfs and whose /etc/hostname is a file
of its own, so the boot writes its real paths and the real squid runs as
on the VM. What is missing is stubbed: `systemctl` logs each call and does
what systemd would for the two services (squid started as a daemon; the
squid-sync agent started in the background); for cloud-init, the machine
says it is a Compute Engine VM (`dmidecode`, `systemd-detect-virt`: this
build machine is a container, where cloud-init reads no DMI). Closing kills
the whole PID namespace (unshare's --kill-child), so nothing the guest
started outlives it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

EMPTY_DIRS = (
    "/etc/squid",
    "/run",
    "/usr/local/sbin",
    "/etc/systemd/system",
    "/etc/cloud",
    "/var/log/squid",
    "/var/spool/squid",
    "/dev/shm",
)
SQUID_OWNED = ("/var/log/squid", "/var/spool/squid")
# --kill-child: when unshare ends, its child (the namespace's init) is killed,
# and with it every process of the PID namespace.
UNSHARE = (
    *("unshare", "--mount", "--propagation", "private", "--uts"),
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

# -e: a mount that fails ends the guest before its boot can write this
# machine's own /etc/hostname or /etc/cloud (the boot's status is kept apart).
_INIT = """\
set -eu
for dir in {dirs}; do mount -t tmpfs -o mode=0755 tmpfs "$dir"; done
chmod 1777 /dev/shm
chown proxy:proxy {squid_owned}
mount --bind {root}/hostname /etc/hostname
product=/sys/class/dmi/id/product_name
[ ! -e "$product" ] || mount --bind {root}/product_name "$product"
cp {root}/cloud.cfg /etc/cloud/cloud.cfg
rc=0
export GCE_METADATA_HOST={host} PATH={root}/bin:$PATH
{{ {boot}; }} >{root}/startup.log 2>&1 || rc=$?
echo "$rc" >{root}/boot.rc
exec sleep infinity
"""

# The machine as a Compute Engine VM tells cloud-init's GCE datasource it is one.
_DMIDECODE = """\
#!/bin/bash
case "$*" in
  *system-product-name*) echo "Google Compute Engine" ;;
  *system-serial-number*) echo "GoogleCloud-4520031799277581759" ;;
esac
"""
_DETECT_VIRT = """\
#!/bin/bash
case "$*" in *--container*) exit 1 ;; esac
echo google
"""
CLOUD_INIT_BOOT = (
    "cloud-init init && cloud-init modules --mode config && cloud-init modules --mode final"
)


def _cloud_cfg(root: Path, metadata_host: str) -> str:
    """The image's /etc/cloud/cloud.cfg: Ubuntu's module order, cut to the
    modules the proxy's user-data uses (the others would change this machine:
    users, SSH host keys, apt, the network's config, disabled here)."""
    return yaml.safe_dump(
        {
            "datasource_list": ["GCE"],
            "datasource": {"GCE": {"metadata_url": f"http://{metadata_host}/computeMetadata/v1/"}},
            "network": {"config": "disabled"},
            "def_log_file": str(root / "cloud-init.log"),
            "output": {"all": f">> {root / 'cloud-init-output.log'}"},
            "syslog_fix_perms": None,
            "system_info": {
                "distro": "debian",
                "paths": {"cloud_dir": str(root / "cloud")},
            },
            "cloud_init_modules": ["bootcmd", "write_files", "set_hostname", "update_hostname"],
            "cloud_config_modules": ["runcmd"],
            "cloud_final_modules": ["write_files_deferred", "scripts_user"],
        }
    )


class Guest:
    """One boot of a startup script (or, `Guest.cloud_init`, of the
    metadata's user-data); `run` runs a command inside the guest. Use it
    with `contextlib.closing`."""

    def __init__(self, startup_script: str | None, metadata_host: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="egress-gce-guest-"))
        (self.root / "bin").mkdir()
        self._tool("systemctl", _SYSTEMCTL.format(root=self.root))
        self._tool("dmidecode", _DMIDECODE)
        self._tool("systemd-detect-virt", _DETECT_VIRT)
        (self.root / "hostname").write_text("localhost\n")
        (self.root / "product_name").write_text("Google Compute Engine\n")
        (self.root / "cloud.cfg").write_text(_cloud_cfg(self.root, metadata_host))
        if startup_script is None:
            boot = CLOUD_INIT_BOOT
        else:
            (self.root / "startup.sh").write_text(startup_script)
            boot = f"bash {self.root}/startup.sh"
        init = _INIT.format(
            dirs=" ".join(EMPTY_DIRS),
            squid_owned=" ".join(SQUID_OWNED),
            host=metadata_host,
            root=self.root,
            boot=boot,
        )
        with (self.root / "init.log").open("wb") as errors:  # a failed mount says why here
            self._unshare = subprocess.Popen(
                [*UNSHARE, "bash", "-c", init],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )

    @classmethod
    def cloud_init(cls, metadata_host: str) -> Guest:
        """A boot of Ubuntu's kind: cloud-init runs the metadata's `user-data`."""
        return cls(None, metadata_host)

    def _tool(self, name: str, text: str) -> None:
        tool = self.root / "bin" / name
        tool.write_text(text)
        tool.chmod(0o755)

    def boot_status(self, timeout: float = 60.0) -> int:
        """The boot's exit status (startup script or cloud-init), once it has ended."""
        deadline = time.monotonic() + timeout
        rc = self.root / "boot.rc"
        while not rc.exists() or not rc.read_text().strip():
            if self._unshare.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the guest's boot did not end:\n{self.log('init.log')}{self.log()}"
                )
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

    def _entered(self, command: tuple[str, ...]) -> list[str]:
        """COMMAND in the guest's mount, PID and UTS namespaces."""
        target = str(self._init_pid())
        return ["nsenter", "--target", target, "--mount", "--pid", "--uts", "--", *command]

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """A command in the guest, waited for."""
        return subprocess.run(self._entered(command), capture_output=True, text=True, timeout=30)

    def popen(self, *command: str) -> subprocess.Popen[str]:
        """A command in the guest, started (its output, both streams, in one pipe)."""
        return subprocess.Popen(
            self._entered(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
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
