"""The startup script for images without cloud-init (Debian's GCP images).

Google's guest agent runs the `startup-script` metadata value as root at every
boot, so every step is idempotent: install squid once, rewrite its files, check
the config with squid itself, restart. The files are the same the cloud-init
user-data writes, from the same renderers.
"""

from __future__ import annotations

from proxyinfra.cloudinit import SQUID_CONF_PATH, SQUID_GROUP
from proxyinfra.squid import DEFAULT_PASSWORD_FILE

HEREDOC_END = "EGRESS_PROXIES_EOF"

_HEAD = """\
#!/bin/bash
# egress-proxies: installs squid and writes its configuration. Run by Google's
# guest agent at every boot; each step is idempotent.
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

# put PATH MODE GROUP < CONTENT: written beside the target and renamed into
# place, so squid never reads half a file; mktemp makes it 0600 until chmod,
# so the password file is never readable by others, not even briefly.
put() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    chown "root:$3" "$tmp"
    chmod "$2" "$tmp"
    mv -f "$tmp" "$1"
}
"""

_TAIL = f"""
# A broken config stops here, with squid's own message in the serial console.
squid -k parse -f {SQUID_CONF_PATH}
systemctl enable squid
systemctl restart squid
"""


def _put(path: str, mode: str, group: str, content: str) -> str:
    if not content.endswith("\n"):
        raise ValueError(f"content for {path} must end with a newline")
    if HEREDOC_END in content.splitlines():
        # It would end the here-document early; never seen in squid.conf or a hash.
        raise ValueError(f"content for {path} holds the line {HEREDOC_END!r}")
    return f"\nput {path} {mode} {group} <<'{HEREDOC_END}'\n{content}{HEREDOC_END}\n"


def render_startup_script(
    squid_conf: str,
    password_file_content: str | None,
    *,
    password_file: str = DEFAULT_PASSWORD_FILE,
) -> str:
    """The bash startup script writing squid.conf (and the password file)."""
    if not squid_conf.strip():
        raise ValueError("squid_conf must be the non-empty text of squid.conf")
    reads_passwords = f" {password_file}\n" in squid_conf
    if reads_passwords != (password_file_content is not None):
        # Either squid could not start, or a password file would lie around unused.
        raise ValueError(
            f"squid.conf {'reads' if reads_passwords else 'does not read'} {password_file} "
            f"but password file content was {'not ' if reads_passwords else ''}given"
        )
    parts = [_HEAD, _put(SQUID_CONF_PATH, "0644", "root", squid_conf)]
    if password_file_content is not None:
        # Readable by squid's group only: it holds a password hash.
        parts.append(_put(password_file, "0640", SQUID_GROUP, password_file_content))
    parts.append(_TAIL)
    return "".join(parts)
