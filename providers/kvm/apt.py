"""A kvm provider's `apt` setting as cloud-config for cloud-init's apt module:
where the VMs' apt installs squid, the guest agent and the user's `packages`
from on first boot (labs and air-gapped sites without Debian's mirrors).

With a mirror, the image's /etc/apt/sources.list is replaced by one line per
suite (cloud-init fills in `$PRIMARY`, `$SECURITY` and `$RELEASE`, the
image's codename); a mirror's own key is trusted for its lines alone
(`signed-by`), written as a file before the apt module runs, because
cloud-init's own key handling needs gpg in the guest, which minimal images
lack (apt reads an armored key itself)."""

from __future__ import annotations

from typing import Any

from providers.kvm.config import KvmApt

KEY_PATH = "/etc/apt/keyrings/egress-proxies-mirror.asc"


def _sources_list(apt: KvmApt) -> str:
    options = f"[signed-by={KEY_PATH}] " if apt.key else ""
    components = " ".join(apt.components)
    lines = [f"deb {options}$PRIMARY {suite} {components}" for suite in apt.suites]
    if apt.security_mirror:
        lines.append(f"deb {options}$SECURITY $RELEASE-security {components}")
    return "\n".join(lines) + "\n"


def apt_cloud_config(apt: KvmApt | None) -> dict[str, Any]:
    """The cloud-config keys of the setting (none when it is unset)."""
    if apt is None:
        return {}
    settings: dict[str, Any] = {}
    config: dict[str, Any] = {"apt": settings}
    if apt.mirror:
        settings["preserve_sources_list"] = False
        settings["primary"] = [{"arches": ["default"], "uri": apt.mirror}]
        if apt.security_mirror:
            settings["security"] = [{"arches": ["default"], "uri": apt.security_mirror}]
        settings["sources_list"] = _sources_list(apt)
    if apt.proxy:
        settings["proxy"] = apt.proxy
    if apt.key:
        # Not deferred: written in the init stage, before the config stage's apt module.
        config["write_files"] = [
            {"path": KEY_PATH, "content": apt.key, "owner": "root:root", "permissions": "0644"}
        ]
    return config
