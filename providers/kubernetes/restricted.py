"""The restricted Pod Security Standard, once for every pod the stack runs
(the proxies, the discovery service, its PostgreSQL): non-root with a fixed
user, no privilege escalation, no capabilities, a read-only root filesystem,
the runtime's default seccomp profile. A namespace enforcing `restricted`
admits these pods; a change here changes all of them alike."""

from __future__ import annotations

import pulumi_kubernetes.core.v1 as core


def container_security() -> core.SecurityContextArgs:
    return core.SecurityContextArgs(
        run_as_non_root=True,
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        capabilities=core.CapabilitiesArgs(drop=["ALL"]),
    )


def pod_security(uid: int) -> core.PodSecurityContextArgs:
    """UID as the user, group and volumes' group of every container."""
    return core.PodSecurityContextArgs(
        run_as_non_root=True,
        run_as_user=uid,
        run_as_group=uid,
        fs_group=uid,
        seccomp_profile=core.SeccompProfileArgs(type="RuntimeDefault"),
    )
