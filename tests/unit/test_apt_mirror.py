"""A kvm provider's `apt` setting: checked with errors that never repeat its
URLs, rendered into every proxy's user-data, and turned by Debian's
cloud-init itself (its apt module's functions, tests/support/cloudinit_sandbox.py)
into the guest's sources.list and apt proxy file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from providers.kvm.apt import KEY_PATH, apt_cloud_config
from providers.kvm.config import DEFAULT_VENDOR_DATA, KvmApt
from proxyinfra.cloudinit import parse_cloud_config, render_user_data
from proxyinfra.squid import SquidSettings, render_squid_conf
from proxyinfra.validation import ConfigError, validate
from tests.support.cloudinit import consumed
from tests.support.stack_config import (
    host,
    kvm_provider,
    machine_type,
    placement,
    proxy,
    stack_config,
)

MIRROR = "http://10.9.0.1:8080/debian"
KEY = (
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ0000BYJKwYBBAHaRw8BAQdA\n"
    "-----END PGP PUBLIC KEY BLOCK-----"
)
SOURCES = "/etc/apt/sources.list"
PROXY_FILE = "/etc/apt/apt.conf.d/90cloud-init-aptproxy"


def user_data(apt: dict[str, Any] | None, own: str | None = None) -> str:
    squid_conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
    settings = apt_cloud_config(KvmApt.model_validate(apt) if apt is not None else None)
    return render_user_data(squid_conf, None, own, hostname="p0", settings=settings)


def config_errors(apt: dict[str, Any], base: Path) -> list[str]:
    (base / "id_ed25519").write_text("key\n")
    provider = kvm_provider(
        "id_ed25519",
        insecure=True,
        name="kvm-home",
        hosts=[host("nas1", "192.0.2.10:22", bridge="br0")],
        machine_types={"small": machine_type()},
        apt=apt,
    )
    where = placement("small", "https://images.example/d.qcow2")
    raw = stack_config([provider], [proxy("home", "kvm-home", where=where)])
    with pytest.raises(ConfigError) as info:
        validate(raw, base)
    return [str(issue) for issue in info.value.issues]


def test_a_mirror_with_its_key_becomes_the_guests_only_source(tmp_path: Path) -> None:
    apt = {"mirror": MIRROR, "suites": ["$RELEASE"], "key": KEY, "proxy": "http://10.9.0.1:3142"}
    result = consumed(user_data(apt, "#cloud-config\npackages: [htop]\n"), DEFAULT_VENDOR_DATA)
    files = result["apt_files"]
    assert files[SOURCES] == f"deb [signed-by={KEY_PATH}] {MIRROR} bookworm main\n"
    assert files[PROXY_FILE] == 'Acquire::http::Proxy "http://10.9.0.1:3142";\n'
    # The key is written in the init stage, before the config stage's apt module.
    key_files = [f for f in result["write_files"] if f["path"] == KEY_PATH]
    assert len(key_files) == 1 and not key_files[0].get("defer") and key_files[0]["content"] == KEY
    assert result["packages"] == ["htop"]  # the user's own, installed from that mirror


def test_the_default_suites_and_a_security_mirror() -> None:
    apt = {"mirror": MIRROR, "securityMirror": "https://sec.example/debian-security"}
    files = consumed(user_data(apt), DEFAULT_VENDOR_DATA)["apt_files"]
    assert files[SOURCES].splitlines() == [
        f"deb {MIRROR} bookworm main",
        f"deb {MIRROR} bookworm-updates main",
        "deb https://sec.example/debian-security bookworm-security main",
    ]
    assert PROXY_FILE not in files


def test_a_proxy_alone_keeps_the_images_sources() -> None:
    files = consumed(user_data({"proxy": "http://cache.lab:3142"}), DEFAULT_VENDOR_DATA)[
        "apt_files"
    ]
    assert SOURCES not in files
    assert files[PROXY_FILE] == 'Acquire::http::Proxy "http://cache.lab:3142";\n'


def test_unset_the_user_data_says_nothing_of_apt() -> None:
    assert "apt" not in parse_cloud_config(user_data(None))
    assert consumed(user_data(None), DEFAULT_VENDOR_DATA)["apt_files"] == {}


@pytest.mark.parametrize(
    ("own", "named"),
    [
        ("#cloud-config\napt:\n  proxy: http://other:3128\n", "'apt.proxy'"),
        ("#cloud-config\napt:\n  sources_list: deb http://x bookworm main\n", "'apt.sources_list'"),
        (f"#cloud-config\nwrite_files:\n  - path: {KEY_PATH}\n    content: x\n", repr(KEY_PATH)),
    ],
)
def test_user_data_may_not_undo_the_setting(own: str, named: str) -> None:
    apt = {"mirror": MIRROR, "key": KEY, "proxy": "http://10.9.0.1:3142"}
    with pytest.raises(ValueError, match=f"may not (set|write) {named}"):
        user_data(apt, own)


def test_user_data_may_write_its_own_files_beside_the_mirrors_key() -> None:
    # The setting's write_files list is checked entry by entry (the key's path),
    # not as a key the user may not set: the proxy's own files go in beside it.
    apt = {"mirror": MIRROR, "key": KEY}
    own = "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: lab proxy\n"
    written = consumed(user_data(apt, own), DEFAULT_VENDOR_DATA)["write_files"]
    contents = {f["path"]: f["content"] for f in written}
    assert contents[KEY_PATH] == KEY
    assert contents["/etc/motd"] == "lab proxy"


def test_user_data_may_add_its_own_apt_sources() -> None:
    own = "#cloud-config\napt:\n  sources:\n    extra.list: {source: deb http://x bookworm main}\n"
    rendered = parse_cloud_config(user_data({"mirror": MIRROR}, own))
    assert rendered["apt"]["primary"] == [{"arches": ["default"], "uri": MIRROR}]
    assert "extra.list" in rendered["apt"]["sources"]


def test_bad_settings_are_named_and_urls_never_echoed(tmp_path: Path) -> None:
    assert config_errors({}, tmp_path) == ["providers[0].kvm.apt: give a mirror, a proxy or both"]
    errors = config_errors({"mirror": MIRROR, "suites": ["bookworm main"]}, tmp_path)
    assert errors == [
        "providers[0].kvm.apt.suites[0]: must be one word of letters, digits, '.', '_', '/', "
        "'-' or '$' (such as $RELEASE) (got 'bookworm main')"
    ]
    errors = config_errors(
        {"mirror": "ftp://mirror.lab/debian", "proxy": "http://user:s3cret@cache.lab:3142"},
        tmp_path,
    )
    assert errors == [
        "providers[0].kvm.apt.mirror: must be an http(s) URL (got scheme 'ftp', host 'mirror.lab')",
        "providers[0].kvm.apt.proxy: must not carry credentials: they would be written into "
        "every VM's apt configuration",
    ]
    assert not any("s3cret" in e for e in errors)
    errors = config_errors({"mirror": "http://[fe80::1/debian"}, tmp_path)
    assert errors == [
        "providers[0].kvm.apt.mirror: must be an http(s) URL (it does not parse as one)"
    ]
    errors = config_errors({"proxy": "http://cache.lab:3142", "key": "not a key"}, tmp_path)
    assert errors == [
        "providers[0].kvm.apt.key: must be an ASCII-armored public key "
        "(-----BEGIN PGP PUBLIC KEY BLOCK----- ...) (got 'not a key')",
    ]
    errors = config_errors({"proxy": "http://cache.lab:3142", "key": KEY}, tmp_path)
    assert errors == ["providers[0].kvm.apt.key: only with a mirror (apt.mirror)"]


@pytest.mark.parametrize("userinfo", ["s3cretT0ken@", "s3cretT0ken:@", ":s3cretT0ken@"])
def test_a_url_carrying_a_token_alone_is_refused_and_never_echoed(
    tmp_path: Path, userinfo: str
) -> None:
    # A token as the URL's user name (http://TOKEN@mirror/) is the usual form:
    # it is a credential as much as a user with a password.
    apt = {
        "mirror": f"http://{userinfo}mirror.lab/debian",
        "securityMirror": f"https://{userinfo}sec.lab/debian-security",
        "proxy": f"http://{userinfo}cache.lab:3142",
    }
    errors = config_errors(apt, tmp_path)
    refusal = "must not carry credentials: they would be written into every VM's apt configuration"
    assert errors == [
        f"providers[0].kvm.apt.{key}: {refusal}" for key in ("mirror", "securityMirror", "proxy")
    ]
    assert not any("s3cretT0ken" in e for e in errors)
