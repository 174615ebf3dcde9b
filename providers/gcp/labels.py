"""GCP labels and network tags that mark a proxy's resources as this stack's."""

from __future__ import annotations

import hashlib
import re

from proxyinfra.backend import ProxyRequest

PROJECT_LABEL = "egress-proxies-project"
STACK_LABEL = "egress-proxies-stack"
NAME_LABEL = "egress-proxies-name"


def label_value(text: str) -> str:
    """A GCP label value: lowercase letters, digits, '_' and '-', at most 63.

    Pulumi project and stack names may hold capitals and dots; those are
    folded rather than refused, since only the stack's own labels get here
    (users' label values are checked in validation instead).
    """
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def proxy_labels(request: ProxyRequest) -> dict[str, str]:
    """The user's labels plus project, stack and logical name (ours win; validation
    refuses user keys with our prefix anyway)."""
    return {
        **request.replica.entry.labels,
        PROJECT_LABEL: label_value(request.project),
        STACK_LABEL: label_value(request.stack),
        NAME_LABEL: label_value(request.replica.name),
    }


def network_tag(project: str, stack: str, provider: str) -> str:
    """The tag the firewall rule targets: one per stack and gcp provider entry, so
    the rule opens this stack's proxies and no other VM of the network."""
    digest = hashlib.sha256(f"{project}\0{stack}\0{provider}".encode()).hexdigest()[:10]
    return f"egress-proxy-{digest}"
