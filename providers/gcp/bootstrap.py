"""What a GCP proxy boots with: cloud-init user-data or a startup script.

Images with cloud-init (Ubuntu's) read the `user-data` metadata key; the rest
(Debian's GCP images have only Google's guest agent) run `startup-script`.
Either way the value carries the password hash and possibly the user's own
cloud-config, so the whole metadata map is a Pulumi secret.
"""

from __future__ import annotations

from typing import Any

import pulumi

from providers.gcp.config import GcpImage
from providers.gcp.startup import render_startup_script
from proxyinfra.backend import ProxyRequest
from proxyinfra.cloudinit import render_user_data
from proxyinfra.squid import password_file_line, render_squid_conf, settings_from_config

USER_DATA_KEY = "user-data"
STARTUP_SCRIPT_KEY = "startup-script"
# Changes of these keys replace the VM: squid is set up from them at first boot.
BOOTSTRAP_KEYS = (USER_DATA_KEY, STARTUP_SCRIPT_KEY)
# SSH through IAM (OS Login) rather than keys in metadata: `gcloud compute ssh`
# would otherwise add an `ssh-keys` entry that `pulumi refresh` sees as drift.
OS_LOGIN = {"enable-oslogin": "TRUE"}


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
        own = request.replica.entry.user_data
        user_data = render_user_data(squid_conf, passwords, own, hostname=request.id)
        return {**OS_LOGIN, USER_DATA_KEY: user_data}
    return {**OS_LOGIN, STARTUP_SCRIPT_KEY: render_startup_script(squid_conf, passwords)}


def metadata(request: ProxyRequest, image: GcpImage) -> pulumi.Output[dict[str, str]]:
    """The metadata as a secret Output (it holds the hash once credentials exist)."""
    creds = request.credentials
    digest: pulumi.Output[Any] = (
        creds.password_hash if creds is not None else pulumi.Output.from_input(None)
    )
    return pulumi.Output.secret(digest.apply(lambda h: render_metadata(request, image, h)))
