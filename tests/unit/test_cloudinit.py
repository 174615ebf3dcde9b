"""cloud-init documents: rendering, merging the user's userData, validation."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from proxyinfra.cloudinit import (
    INSTALL_SQUID,
    default_vendor_data,
    merge_cloud_config,
    parse_cloud_config,
    render_meta_data,
    render_user_data,
)
from proxyinfra.squid import SquidSettings, password_file_line, render_squid_conf
from tests.support import assert_golden

# bcrypt of "golden-password" (cost 4), fixed so rendered text is stable.
FIXED_HASH = "$2b$04$bvm.OktaeZIpywMzu35NVear2J3xhiQSv7SKKa/COIqcpXw9b6wkm"
CONF = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
AUTH_CONF = render_squid_conf(
    SquidSettings(allowed_clients=("10.0.0.0/8",), auth_username="crawler")
)
PASSWORDS = password_file_line("crawler", FIXED_HASH)

USER_DATA = """\
#cloud-config
# the operator's own additions
packages: [htop, squid]
runcmd:
  - echo user-step
write_files:
  - path: /etc/motd
    content: |
      managed proxy
timezone: Europe/Berlin
apt:
  primary:
    - arches: [default]
      uri: http://mirror.example/debian
"""


def _load(user_data: str) -> dict[str, Any]:
    assert user_data.startswith("#cloud-config\n")
    loaded = yaml.safe_load(user_data)
    assert isinstance(loaded, dict)
    return loaded


def test_golden_without_auth() -> None:
    text = render_user_data(CONF, None, None, hostname="proxy-0123456789")
    assert_golden("user_data_no_auth.yaml", text)


def test_golden_with_auth_and_user_data() -> None:
    text = render_user_data(AUTH_CONF, PASSWORDS, USER_DATA, hostname="proxy-0123456789")
    assert_golden("user_data_auth_merged.yaml", text)


def test_golden_vendor_and_meta_data() -> None:
    assert_golden("vendor_data.sh", default_vendor_data())
    assert_golden("meta_data.yaml", render_meta_data("proxy-0123456789", "proxy-0123456789"))


def test_proxy_document_installs_writes_and_restarts() -> None:
    doc = _load(render_user_data(AUTH_CONF, PASSWORDS, None))
    assert "packages" not in doc  # an apt-get update per boot, even when the image has squid
    conf, passwords = doc["write_files"]
    assert conf == {
        "path": "/etc/squid/squid.conf",
        "content": AUTH_CONF,
        "owner": "root:root",
        "permissions": "0644",
        "defer": True,
    }
    assert passwords == {
        "path": "/etc/squid/passwords",
        "content": PASSWORDS,
        "owner": "root:proxy",
        "permissions": "0640",
        "defer": True,
    }
    assert doc["runcmd"] == [
        INSTALL_SQUID,
        "systemctl enable --no-reload squid",
        "systemctl restart squid",
    ]
    assert "hostname" not in doc


def test_content_round_trips_exactly() -> None:
    # Literal blocks must keep every byte, with or without a final newline.
    for conf in (CONF, CONF.rstrip("\n"), CONF + "\n\n"):
        doc = _load(render_user_data(conf, None, None))
        assert doc["write_files"][0]["content"] == conf


def test_custom_password_file_path() -> None:
    settings = SquidSettings(
        allowed_clients=("10.0.0.0/8",), auth_username="crawler", password_file="/etc/squid/users"
    )
    text = render_user_data(
        render_squid_conf(settings), PASSWORDS, None, password_file="/etc/squid/users"
    )
    assert _load(text)["write_files"][1]["path"] == "/etc/squid/users"


def test_auth_needs_password_file_and_vice_versa_without_leaking() -> None:
    with pytest.raises(ValueError, match="no content was given"):
        render_user_data(AUTH_CONF, None, None)
    with pytest.raises(ValueError, match="does not read") as info:
        render_user_data(CONF, PASSWORDS, None)
    assert FIXED_HASH not in str(info.value)


def test_merge_lists_concatenate_ours_first_and_scalars_from_user() -> None:
    doc = _load(render_user_data(CONF, None, USER_DATA, hostname="proxy-0123456789"))
    assert doc["packages"] == ["htop", "squid"]
    assert doc["runcmd"][-2:] == ["systemctl restart squid", "echo user-step"]
    assert [f["path"] for f in doc["write_files"]] == ["/etc/squid/squid.conf", "/etc/motd"]
    assert doc["timezone"] == "Europe/Berlin"
    assert doc["apt"]["primary"][0]["uri"] == "http://mirror.example/debian"
    assert doc["hostname"] == "proxy-0123456789"


def test_merge_is_recursive_for_mappings() -> None:
    ours = {"a": {"x": 1, "list": [1], "inner": {"k": "ours"}}, "s": "ours"}
    theirs = {"a": {"y": 2, "list": [2], "inner": {"k": "theirs", "j": 3}}, "s": "theirs"}
    assert merge_cloud_config(ours, theirs) == {
        "a": {"x": 1, "y": 2, "list": [1, 2], "inner": {"k": "theirs", "j": 3}},
        "s": "theirs",
    }
    # Inputs stay untouched.
    assert ours["a"] == {"x": 1, "list": [1], "inner": {"k": "ours"}}


def test_merge_empty_user_key_keeps_ours() -> None:
    assert merge_cloud_config({"runcmd": ["a"]}, {"runcmd": None}) == {"runcmd": ["a"]}


@pytest.mark.parametrize(
    ("user_data", "fragment"),
    [
        ("#cloud-config\nruncmd: reboot\n", "'runcmd' is a string, but the proxy's own"),
        ("#cloud-config\nruncmd: {a: 1}\n", "'runcmd' is a mapping"),
        ("#cloud-config\nwrite_files: 3\n", "'write_files' is a number"),
    ],
)
def test_merge_type_mismatch_names_the_key(user_data: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        render_user_data(CONF, None, user_data)


def test_nested_type_mismatch_names_the_dotted_path() -> None:
    with pytest.raises(ValueError, match=r"'a\.b' is a list"):
        merge_cloud_config({"a": {"b": {"c": 1}}}, {"a": {"b": [1]}})


@pytest.mark.parametrize(
    "path", ["/etc/squid/squid.conf", "/etc/squid//squid.conf", "/etc/squid/passwords"]
)
def test_user_may_not_overwrite_proxy_files(path: str) -> None:
    user_data = (
        f"#cloud-config\nwrite_files:\n  - path: {path}\n    content: 'http_access allow all'\n"
    )
    with pytest.raises(ValueError, match="the proxy writes that file") as info:
        render_user_data(AUTH_CONF, PASSWORDS, user_data)
    assert "allow all" not in str(info.value)


def test_password_path_is_free_without_auth() -> None:
    user_data = "#cloud-config\nwrite_files:\n  - path: /etc/squid/passwords\n    content: x\n"
    doc = _load(render_user_data(CONF, None, user_data))
    assert doc["write_files"][1]["path"] == "/etc/squid/passwords"


def test_hostname_is_owned_by_the_proxy() -> None:
    with pytest.raises(ValueError, match="'hostname'"):
        render_user_data(CONF, None, "#cloud-config\nhostname: other\n", hostname="proxy-1")
    same = render_user_data(CONF, None, "#cloud-config\nhostname: proxy-1\n", hostname="proxy-1")
    assert _load(same)["hostname"] == "proxy-1"
    # Without a proxy hostname the user's wins like any scalar.
    assert (
        _load(render_user_data(CONF, None, "#cloud-config\nhostname: mine\n"))["hostname"] == "mine"
    )


@pytest.mark.parametrize(
    ("user_data", "found"),
    [
        ("#!/bin/bash\necho hi\n", "a shell script"),
        ("## template: jinja\n#cloud-config\n", "a template"),
        ("Content-Type: multipart/mixed; boundary=x\n", "a MIME multi-part document"),
        ("#cloud-config-archive\n- type: text/x-shellscript\n", "a cloud-config archive"),
        ("#include\nhttp://example/\n", "an #include list"),
        ("", "an empty document"),
        ("packages: [htop]\n", "first line is not '#cloud-config'"),
        ("  #cloud-config\npackages: []\n", "first line is not '#cloud-config'"),
    ],
)
def test_user_data_must_be_cloud_config(user_data: str, found: str) -> None:
    with pytest.raises(ValueError) as info:
        render_user_data(CONF, None, user_data)
    assert "must be a '#cloud-config' YAML document" in str(info.value)
    assert found in str(info.value)


@pytest.mark.parametrize(
    ("user_data", "found"),
    [
        ("#cloud-config\n- a\n- b\n", "found a list"),
        ("#cloud-config\njust text\n", "found a string"),
    ],
)
def test_user_data_must_be_a_mapping(user_data: str, found: str) -> None:
    with pytest.raises(ValueError, match=found):
        render_user_data(CONF, None, user_data)


def test_header_only_user_data_adds_nothing() -> None:
    assert render_user_data(CONF, None, "#cloud-config\n") == render_user_data(CONF, None, None)
    assert render_user_data(CONF, None, "#cloud-config\r\n") == render_user_data(CONF, None, None)


def test_invalid_yaml_error_has_position_not_content() -> None:
    user_data = '#cloud-config\nchpasswd:\n  list: "root:Sup3rSecret\n  bad: [\n'
    with pytest.raises(ValueError) as info:
        parse_cloud_config(user_data)
    message = str(info.value)
    assert "not valid YAML at line" in message
    assert "Sup3rSecret" not in message


def test_output_is_deterministic_and_independent_of_user_key_order() -> None:
    a = "#cloud-config\ntimezone: UTC\nlocale: C.UTF-8\nntp: {enabled: true, servers: [a]}\n"
    b = "#cloud-config\nntp: {servers: [a], enabled: true}\nlocale: C.UTF-8\ntimezone: UTC\n"
    first = render_user_data(AUTH_CONF, PASSWORDS, a, hostname="proxy-1")
    assert first == render_user_data(AUTH_CONF, PASSWORDS, a, hostname="proxy-1")
    assert first == render_user_data(AUTH_CONF, PASSWORDS, b, hostname="proxy-1")


def test_no_yaml_anchors_in_output() -> None:
    # A user document with aliases must not come back with &id001/*id001.
    user_data = "#cloud-config\nx: &a [1, 2]\ny: *a\n"
    text = render_user_data(CONF, None, user_data)
    assert "&id" not in text
    assert "*id" not in text
    assert _load(text)["y"] == [1, 2]


@pytest.mark.parametrize("hostname", ["bad_name", "-x", "a" * 64, ""])
def test_bad_hostname_is_rejected(hostname: str) -> None:
    with pytest.raises(ValueError, match="hostname"):
        render_user_data(CONF, None, None, hostname=hostname)
    with pytest.raises(ValueError, match="hostname"):
        render_meta_data("proxy-1", hostname)


@pytest.mark.parametrize("instance_id", ["", "a/b", "../x", "a b", "x" * 129])
def test_bad_instance_id_is_rejected(instance_id: str) -> None:
    with pytest.raises(ValueError, match="instance_id"):
        render_meta_data(instance_id, "proxy-1")


def test_meta_data_fields() -> None:
    assert yaml.safe_load(render_meta_data("proxy-abc.1", "proxy-abc")) == {
        "instance-id": "proxy-abc.1",
        "local-hostname": "proxy-abc",
    }


def test_empty_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="squid_conf"):
        render_user_data("  \n", None, None)
    with pytest.raises(ValueError, match="password_file_content"):
        render_user_data(AUTH_CONF, "", None)


def test_vendor_data_is_a_valid_script_for_the_guest_agent() -> None:
    script = default_vendor_data()
    assert script.startswith("#!/bin/sh\n")
    assert "apt-get install -y qemu-guest-agent" in script
    assert "systemctl start qemu-guest-agent" in script
    subprocess.run(["sh", "-n"], input=script.encode(), check=True)
