"""The startup script for images without cloud-init (Debian's GCP images).

Google's guest agent runs the `startup-script` metadata value as root at every
boot, so every step is idempotent: install squid once, put the squid-sync
agent and its unit in place, have the agent write squid's files from the
metadata (checked by squid itself), restart squid, start the agent watching.
The script holds nothing of a proxy's own: a squid change leaves it as it
is, so the VM stays (providers/gcp/squid_sync.py).
"""

from __future__ import annotations

from providers.gcp.squid_sync import AGENT_PATH, AGENT_SCRIPT, BOOT_COMMANDS, UNIT, UNIT_PATH

HEREDOC_END = "EGRESS_PROXIES_EOF"

_HEAD = """\
#!/bin/bash
# egress-proxies: installs squid and the agent that keeps its files as this
# VM's metadata says. Run by Google's guest agent at every boot; each step is
# idempotent.
set -euo pipefail

if ! command -v apt-get >/dev/null 2>&1; then
    echo "egress-proxies: this startup script needs an apt-based image (Debian, Ubuntu)" >&2
    exit 1
fi

if [ ! -x /usr/sbin/squid ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o Acquire::Retries=5 update
    apt-get -o Acquire::Retries=5 install -y --no-install-recommends squid
fi

# put PATH MODE < CONTENT: written beside the target and renamed into place,
# so nothing ever runs or reads half a file.
put() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    chown root:root "$tmp"
    chmod "$2" "$tmp"
    mv -f "$tmp" "$1"
}
"""


def _put(path: str, mode: str, content: str) -> str:
    if not content.endswith("\n"):
        raise ValueError(f"content for {path} must end with a newline")
    if HEREDOC_END in content.splitlines():
        raise ValueError(f"content for {path} holds the line {HEREDOC_END!r}")
    return f"\nput {path} {mode} <<'{HEREDOC_END}'\n{content}{HEREDOC_END}\n"


def render_startup_script() -> str:
    """The bash startup script: the same for every proxy of every stack."""
    parts = [
        _HEAD,
        _put(AGENT_PATH, "0755", AGENT_SCRIPT),
        _put(UNIT_PATH, "0644", UNIT),
        "\n# A config squid refuses stops here, with squid's own message in the serial console.\n",
        *(f"{command}\n" for command in BOOT_COMMANDS),
    ]
    return "".join(parts)
