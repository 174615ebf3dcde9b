"""How squid runs in the proxy's container: paths, user, command.

squid runs as the image's `proxy` user (uid 13 on Debian and Ubuntu) on a
read-only root filesystem. Everything it writes lives in emptyDir volumes;
squid.conf comes from a ConfigMap, the password file from a Secret, each
mounted as a directory (a subPath mount would never see updates).

Logs: squid cannot write to the container's stdout itself (measured with
squid 5.7 as a non-root user: `access_log daemon:/dev/stdout` kills squid,
`stdio:/dev/stdout` is refused), and a log file would grow without
rotation, so both logs go to /dev/null and `-d 1` copies cache.log's
important lines to stderr, where `kubectl logs` finds them.
"""

from __future__ import annotations

from proxyinfra.config import Squid
from proxyinfra.squid import SquidSettings, settings_from_config

CONFIG_DIR = "/etc/squid-egress"
AUTH_DIR = "/etc/squid-egress-auth"
RUN_DIR = "/run/squid"
SPOOL_DIR = "/var/spool/squid"
CONFIG_KEY = "squid.conf"
PASSWORDS_KEY = "passwords"
SQUID_UID = 13  # "proxy" in Debian's and Ubuntu's base-passwd

# What the container runs; -N keeps squid in the foreground as PID 1's only job.
SQUID_COMMAND = ["/usr/sbin/squid"]
SQUID_ARGS = ["-N", "-d", "1", "-f", f"{CONFIG_DIR}/{CONFIG_KEY}"]

CONTAINER_PATHS: dict[str, str] = {
    "password_file": f"{AUTH_DIR}/{PASSWORDS_KEY}",
    "pid_file": f"{RUN_DIR}/squid.pid",
    "access_log": "/dev/null",
    "cache_log": "/dev/null",
    "coredump_dir": SPOOL_DIR,
}


def container_settings(squid: Squid) -> SquidSettings:
    """The shared renderer's settings with the container's paths."""
    return settings_from_config(squid, **CONTAINER_PATHS)
