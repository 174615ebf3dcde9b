"""squid's files in a GCP proxy's metadata, and the agent that applies them.

A GCP VM's metadata changes in place (no new VM), and its metadata server
answers a long poll when a value changes. So squid's files live in keys of
their own, apart from the boot data (`startup-script`, `user-data`), and an
agent on the VM (squid-sync.sh, a systemd unit the boot data installs)
applies each change the way the kvm backend applies one through the QEMU
guest agent: checked by `squid -k parse`, moved in by rename, squid
reloaded. A squid change is then an update of the instance, not a new one.

The digest key names one version of both files: the agent watches it and
reads the files again when what it read does not match (the metadata moved
on between two reads).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from proxyinfra.cloudinit import check_auth_consistency
from proxyinfra.squid import DEFAULT_PASSWORD_FILE

CONF_KEY = "egress-proxies-squid-conf"
PASSWORDS_KEY = "egress-proxies-squid-passwords"
DIGEST_KEY = "egress-proxies-squid-sha256"
# The agent reports what it applied, and what squid refused, as guest attributes.
GUEST_ATTRIBUTES = {"enable-guest-attributes": "TRUE"}

AGENT_PATH = "/usr/local/sbin/egress-proxies-squid-sync"
UNIT_NAME = "egress-proxies-squid-sync.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
AGENT_SCRIPT = (Path(__file__).parent / "squid-sync.sh").read_text()

UNIT = f"""\
[Unit]
Description=egress-proxies: squid's files from this VM's metadata, applied in place
Wants=network-online.target
After=network-online.target squid.service

[Service]
ExecStart={AGENT_PATH} --watch
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""

# What the boot data runs once the agent and its unit are in place: squid's
# files from the metadata (a config squid refuses stops the boot data here,
# with squid's message), squid restarted on them, then the agent watching.
BOOT_COMMANDS = (
    f"{AGENT_PATH} --once",
    "systemctl enable squid",
    "systemctl restart squid",
    "systemctl daemon-reload",
    f"systemctl enable --now {UNIT_NAME}",
)


def squid_digest(squid_conf: str, password_file_content: str | None) -> str:
    """sha256 of squid.conf, a NUL, the password file (the agent's `digest`)."""
    data = squid_conf.encode() + b"\0" + (password_file_content or "").encode()
    return hashlib.sha256(data).hexdigest()


def squid_metadata(squid_conf: str, password_file_content: str | None) -> dict[str, str]:
    """The metadata keys holding squid's files (secret: the password hash)."""
    if not squid_conf.strip() or not squid_conf.endswith("\n"):
        raise ValueError("squid_conf must be the text of squid.conf, ending with a newline")
    if password_file_content is not None and not password_file_content.strip():
        raise ValueError("password_file_content must not be empty (give None for no auth)")
    # squid could not start on a conf without its file, and a file no conf reads is a leftover.
    check_auth_consistency(squid_conf, password_file_content, DEFAULT_PASSWORD_FILE)
    keys = {CONF_KEY: squid_conf}
    if password_file_content is not None:
        keys[PASSWORDS_KEY] = password_file_content
    keys[DIGEST_KEY] = squid_digest(squid_conf, password_file_content)
    return keys
