"""cloud-init NoCloud documents (user-data, vendor-data, meta-data) for VM proxies.

The user-data installs squid (when the image lacks it), writes its config
(and password file), restarts it, and carries the operator's own `userData` merged in:

- mappings merge recursively, lists concatenate (the proxy's items first, so
  its files and commands come before the user's);
- for scalars the user's value wins, except where the proxy's own setup would
  break: a user `write_files` entry for a file the proxy writes (squid.conf,
  the password file) and a `hostname` other than the proxy's (its
  deterministic name, shared with meta-data and the fleet) are errors, never
  silently dropped;
- a user key whose type differs from the proxy's (e.g. `runcmd: reboot`) is an
  error; an empty user key (`runcmd:` with nothing) adds nothing.

Every document is deterministic: mapping keys are emitted sorted.  Errors name
keys, paths and types but never values: the user-data holds password hashes,
and the user's document may hold secrets of its own.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import yaml

from proxyinfra.squid import DEFAULT_PASSWORD_FILE, check_hostname

CLOUD_CONFIG_HEADER = "#cloud-config"
SQUID_CONF_PATH = "/etc/squid/squid.conf"
# Debian's squid package runs squid as user/group "proxy".
SQUID_GROUP = "proxy"

_INSTANCE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

# What a non-cloud-config user-data looks like, to say what was found instead.
_OTHER_FORMATS = (
    ("#cloud-config-archive", "a cloud-config archive"),
    ("#cloud-boothook", "a boothook"),
    ("#include", "an #include list"),
    ("#part-handler", "a part handler"),
    ("#upstart-job", "an upstart job"),
    ("## template:", "a template"),
    ("#!", "a shell script"),
    ("content-type:", "a MIME multi-part document"),
    ("mime-version:", "a MIME multi-part document"),
    ("\x1f\x8b", "gzip-compressed data"),
)

# Vendor-data as a script, not #cloud-config: cloud-init lets user-data keys
# replace vendor-data keys wholesale: a vendor `packages: [qemu-guest-agent]`
# would be dropped by any user `packages`.
_VENDOR_SCRIPT = """\
#!/bin/sh
# egress-proxies vendor-data: the QEMU guest agent lets the libvirt host read
# this VM's addresses (virsh domifaddr --source agent).
set -eu
if ! dpkg-query -W -f '${Status}' qemu-guest-agent 2>/dev/null | grep -q 'install ok installed'
then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-guest-agent
fi
# The unit is started by udev when the agent's virtio channel exists; without
# that channel it cannot run, which must not fail the whole boot.
systemctl start qemu-guest-agent || echo "qemu-guest-agent not started (no channel?)" >&2
"""


class _Dumper(yaml.SafeDumper):
    """Block literals for multi-line text, no anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _dump(document: dict[str, Any]) -> str:
    try:
        body = yaml.dump(
            document,
            Dumper=_Dumper,
            sort_keys=True,
            default_flow_style=False,
            allow_unicode=True,
            width=1 << 16,
        )
    except TypeError:
        raise ValueError("userData has mapping keys that cannot be ordered (mixed types)") from None
    return f"{CLOUD_CONFIG_HEADER}\n{body}"


def _found_instead(text: str) -> str:
    stripped = text.strip()
    if not stripped:
        return "an empty document"
    lowered = stripped.lower()
    for prefix, what in _OTHER_FORMATS:
        if lowered.startswith(prefix):
            return what
    return f"a document whose first line is not {CLOUD_CONFIG_HEADER!r}"


def _type_name(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return f"a {type(value).__name__}"


def parse_cloud_config(text: str, what: str = "userData") -> dict[str, Any]:
    """A #cloud-config document to its mapping; ValueError says what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, got {_type_name(text)}")
    first_line = text.split("\n", 1)[0].rstrip()
    if first_line != CLOUD_CONFIG_HEADER:
        raise ValueError(
            f"{what} must be a {CLOUD_CONFIG_HEADER!r} YAML document "
            f"(first line {CLOUD_CONFIG_HEADER!r}); found {_found_instead(text)}"
        )
    try:
        loaded = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        # The mark locates the problem; the snippet is left out (secrets).
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{what} is not valid YAML{where}: {exc.problem}") from None
    except yaml.YAMLError:
        raise ValueError(f"{what} is not valid YAML") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{what} must be a YAML mapping; found {_type_name(loaded)}")
    return loaded


def merge_cloud_config(
    ours: dict[str, Any], theirs: dict[str, Any], path: str = ""
) -> dict[str, Any]:
    """Merge a user's cloud-config into ours (see the module docstring)."""
    merged = dict(ours)
    for key, their_value in theirs.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key in merged:
            merged[key] = _merge_value(merged[key], their_value, key_path)
        else:
            merged[key] = their_value
    return merged


def _merge_value(ours: Any, theirs: Any, key_path: str) -> Any:
    containers = (dict, list)
    if theirs is None and isinstance(ours, containers):
        return ours
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return merge_cloud_config(ours, theirs, key_path)
    if isinstance(ours, list) and isinstance(theirs, list):
        return ours + theirs
    if isinstance(ours, containers) or isinstance(theirs, containers):
        raise ValueError(
            f"userData key {key_path!r} is {_type_name(theirs)}, "
            f"but the proxy's own cloud-config has {_type_name(ours)} there"
        )
    return theirs


def _check_settings(theirs: dict[str, Any], settings: dict[str, Any], path: str = "") -> None:
    """A user key that one of the provider's settings already sets is an error
    (lists excepted: `write_files` entries are checked by path)."""
    for key, value in settings.items():
        key_path = f"{path}.{key}" if path else str(key)
        their_value = theirs.get(key)
        if their_value is None or isinstance(value, list):
            continue
        if isinstance(value, dict) and isinstance(their_value, dict):
            _check_settings(their_value, value, key_path)
            continue
        raise ValueError(
            f"userData may not set {key_path!r}: the provider's settings set it (change them there)"
        )


def _check_protected(theirs: dict[str, Any], owned_paths: list[str], hostname: str | None) -> None:
    files = theirs.get("write_files")
    for entry in files if isinstance(files, list) else []:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and posixpath.normpath(path) in owned_paths:
            raise ValueError(
                f"userData write_files may not write {path!r}: the proxy writes that file"
            )
    if hostname is not None and "hostname" in theirs and theirs["hostname"] != hostname:
        raise ValueError(
            "userData may not set 'hostname': the proxy's hostname is its deterministic name"
        )


# Not `packages: [squid]`: that runs `apt-get update` on every boot even when
# the image has squid (11 s per VM under emulation, and a mirror round trip in
# production). confold keeps the squid.conf written just before.
INSTALL_SQUID = (
    "[ -x /usr/sbin/squid ] || { apt-get update && DEBIAN_FRONTEND=noninteractive "
    "apt-get install -y -o Dpkg::Options::=--force-confold squid; }"
)


def write_file(path: str, content: str, owner: str, permissions: str) -> dict[str, Any]:
    # defer: written in cloud-init's final stage, after any user `packages`;
    # the proxy group owning the password file is Debian's base-passwd own.
    return {
        "path": path,
        "content": content,
        "owner": owner,
        "permissions": permissions,
        "defer": True,
    }


def _proxy_config(
    squid_conf: str, password_file_content: str | None, password_file: str, hostname: str | None
) -> dict[str, Any]:
    files = [write_file(SQUID_CONF_PATH, squid_conf, "root:root", "0644")]
    if password_file_content is not None:
        # Readable by squid's group only: it holds password hashes.
        files.append(
            write_file(password_file, password_file_content, f"root:{SQUID_GROUP}", "0640")
        )
    config: dict[str, Any] = {
        "write_files": files,
        # runcmd runs after the deferred files are written (scripts-user
        # follows write-files-deferred in the final stage).
        "runcmd": [INSTALL_SQUID, "systemctl enable --no-reload squid", "systemctl restart squid"],
    }
    if hostname is not None:
        config["hostname"] = hostname
    return config


def _reads_password_file(squid_conf: str, password_file: str) -> bool:
    line = rf"^auth_param basic program \S+ {re.escape(password_file)}$"
    return re.search(line, squid_conf, re.MULTILINE) is not None


def check_auth_consistency(
    squid_conf: str, password_file_content: str | None, password_file: str
) -> None:
    # A mismatch would leave squid unable to start, or a password file unused.
    uses_auth = _reads_password_file(squid_conf, password_file)
    if uses_auth and password_file_content is None:
        raise ValueError(
            f"squid.conf authenticates against {password_file} but no content was given"
        )
    if not uses_auth and password_file_content is not None:
        raise ValueError(f"a password file was given but squid.conf does not read {password_file}")


def render_user_data(
    squid_conf: str,
    password_file_content: str | None,
    user_data: str | None,
    *,
    hostname: str | None = None,
    password_file: str = DEFAULT_PASSWORD_FILE,
    settings: dict[str, Any] | None = None,
) -> str:
    """The proxy's #cloud-config user-data, with the user's own merged in.
    `settings`: cloud-config of the provider's own settings (its apt mirror),
    added to the proxy's; the user's document may not set what they set."""
    if not isinstance(squid_conf, str) or not squid_conf.strip():
        raise ValueError("squid_conf must be the non-empty text of squid.conf")
    if password_file_content is not None and not password_file_content.strip():
        raise ValueError("password_file_content must not be empty (give None for no auth)")
    if hostname is not None:
        check_hostname("hostname", hostname)
    check_auth_consistency(squid_conf, password_file_content, password_file)
    settings = settings or {}
    ours = merge_cloud_config(
        settings, _proxy_config(squid_conf, password_file_content, password_file, hostname)
    )
    owned = [SQUID_CONF_PATH]
    if password_file_content is not None:
        owned.append(password_file)
    return merge_user_data(ours, user_data, owned, hostname=hostname, settings=settings)


def merge_user_data(
    ours: dict[str, Any],
    user_data: str | None,
    owned: list[str],
    *,
    hostname: str | None = None,
    settings: dict[str, Any] | None = None,
) -> str:
    """The #cloud-config of `ours` with the user's own merged in. The user's
    may write none of the `owned` files (nor the settings' own), set another
    hostname, or set what the provider's `settings` set."""
    if user_data is None:
        return _dump(ours)
    settings = settings or {}
    theirs = parse_cloud_config(user_data)
    owned = [posixpath.normpath(path) for path in owned]
    owned += [posixpath.normpath(f["path"]) for f in settings.get("write_files", [])]
    _check_protected(theirs, owned, hostname)
    _check_settings(theirs, settings)
    return _dump(merge_cloud_config(ours, theirs))


def default_vendor_data() -> str:
    """Vendor-data that installs (when missing) and starts qemu-guest-agent."""
    return _VENDOR_SCRIPT


def render_meta_data(instance_id: str, hostname: str) -> str:
    """NoCloud meta-data: a new instance-id makes cloud-init run again."""
    if not isinstance(instance_id, str) or not _INSTANCE_ID_RE.fullmatch(instance_id):
        # cloud-init uses it as a directory name under /var/lib/cloud/instances.
        raise ValueError(
            f"instance_id {instance_id!r} is invalid: use up to 128 characters "
            "from A-Z a-z 0-9 . _ - starting with a letter or digit"
        )
    check_hostname("hostname", hostname)
    document = {"instance-id": instance_id, "local-hostname": hostname}
    return yaml.safe_dump(document, sort_keys=True, default_flow_style=False)
