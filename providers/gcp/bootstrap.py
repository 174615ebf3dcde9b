"""What a GCP proxy boots with, and squid's files beside it in the metadata.

Images with cloud-init (Ubuntu's) read the `user-data` metadata key; the rest
(Debian's GCP images have only Google's guest agent) run `startup-script`.
Either installs squid and the squid-sync agent, which writes squid's files
from keys of their own and applies their changes in place
(providers/gcp/squid_sync.py). The whole metadata map is a Pulumi secret:
squid's keys hold the password hash, and the user's cloud-config may hold
secrets of its own.
"""

from __future__ import annotations

from typing import Any

import pulumi

from providers.gcp.config import GcpImage
from providers.gcp.squid_sync import (
    AGENT_PATH,
    AGENT_SCRIPT,
    BOOT_COMMANDS,
    GUEST_ATTRIBUTES,
    UNIT,
    UNIT_PATH,
    squid_metadata,
)
from providers.gcp.startup import render_startup_script
from proxyinfra.backend import ProxyRequest
from proxyinfra.cloudinit import INSTALL_SQUID, SQUID_CONF_PATH, merge_user_data, write_file
from proxyinfra.squid import (
    DEFAULT_PASSWORD_FILE,
    check_hostname,
    password_file_line,
    render_squid_conf,
    settings_from_config,
)

USER_DATA_KEY = "user-data"
STARTUP_SCRIPT_KEY = "startup-script"
# Changes of these keys replace the VM: they run at its first boot (user-data)
# or hold the agent it runs (startup-script). squid's own keys change in place.
BOOTSTRAP_KEYS = (USER_DATA_KEY, STARTUP_SCRIPT_KEY)
# SSH through IAM (OS Login) rather than keys in metadata: `gcloud compute ssh`
# would otherwise add an `ssh-keys` entry that `pulumi refresh` sees as drift.
OS_LOGIN = {"enable-oslogin": "TRUE"}


def render_user_data(user_data: str | None, hostname: str) -> str:
    """The cloud-config for images with cloud-init: squid and the agent, then
    what the startup script runs; the user's own merged in."""
    check_hostname("hostname", hostname)
    ours: dict[str, Any] = {
        "hostname": hostname,
        "write_files": [
            write_file(AGENT_PATH, AGENT_SCRIPT, "root:root", "0755"),
            write_file(UNIT_PATH, UNIT, "root:root", "0644"),
        ],
        # runcmd runs after the deferred files are written, as one sh script
        # without `set -e`: one command, so that a config squid refuses stops
        # it before squid restarts, as it stops the startup script.
        "runcmd": [INSTALL_SQUID, " && ".join(BOOT_COMMANDS)],
    }
    owned = [SQUID_CONF_PATH, DEFAULT_PASSWORD_FILE, AGENT_PATH, UNIT_PATH]
    return merge_user_data(ours, user_data, owned, hostname=hostname)


def render_metadata(
    request: ProxyRequest, image: GcpImage, password_hash: str | None
) -> dict[str, str]:
    """The instance metadata for this proxy (plain; callers keep it secret)."""
    squid_conf = render_squid_conf(settings_from_config(request.squid))
    creds = request.credentials
    passwords = None
    if creds is not None:
        if password_hash is None:
            raise ValueError(f"{request.replica.name}: credentials without a password hash")
        passwords = password_file_line(creds.username, password_hash)
    if image.bootstrap_method == "cloud-init":
        boot = {USER_DATA_KEY: render_user_data(request.replica.entry.user_data, request.id)}
    else:
        boot = {STARTUP_SCRIPT_KEY: render_startup_script()}
    return {**OS_LOGIN, **GUEST_ATTRIBUTES, **boot, **squid_metadata(squid_conf, passwords)}


def metadata(request: ProxyRequest, image: GcpImage) -> pulumi.Output[dict[str, str]]:
    """The metadata as a secret Output (it holds the hash once credentials exist)."""
    creds = request.credentials
    digest: pulumi.Output[Any] = (
        creds.password_hash if creds is not None else pulumi.Output.from_input(None)
    )
    return pulumi.Output.secret(digest.apply(lambda h: render_metadata(request, image, h)))
