"""squid.conf rendering, validation and password hashing (no squid process)."""

from __future__ import annotations

import bcrypt
import pytest

from proxyinfra.squid import (
    DEFAULT_BLOCKED_DESTINATIONS,
    SquidSettings,
    hash_password,
    password_file_line,
    render_squid_conf,
)
from tests.support import assert_golden

# bcrypt of "golden-password" (cost 4), fixed so rendered text is stable.
FIXED_HASH = "$2b$04$bvm.OktaeZIpywMzu35NVear2J3xhiQSv7SKKa/COIqcpXw9b6wkm"


def _lines(conf: str, prefix: str) -> list[str]:
    return [line for line in conf.splitlines() if line.startswith(prefix)]


def test_golden_minimal() -> None:
    conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
    assert_golden("squid_minimal.conf", conf)


def test_golden_auth_several_networks_and_ranges() -> None:
    settings = SquidSettings(
        port=8080,
        allowed_clients=("192.168.1.0/24", "10.0.0.0/8", "10.20.0.0/16", "2001:db8::/32"),
        connect_ports=("443", "8443-8450", "8445"),
        auth_username="crawler",
    )
    assert_golden("squid_auth.conf", render_squid_conf(settings))


def test_container_settings_always_rendered() -> None:
    for auth in (None, "crawler"):
        conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",), auth_username=auth))
        assert "\nmax_filedescriptors 1024\n" in conf
        assert "\ncache_mem 16 MB\n" in conf


def test_no_caching_and_privacy() -> None:
    conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
    assert "\ncache deny all\n" in conf
    assert "\nforwarded_for delete\n" in conf
    assert "\nrequest_header_access Via deny all\n" in conf
    assert "\nrequest_header_access Cache-Control deny !client_cache_control\n" in conf
    assert "cache_dir" not in conf


def test_http_access_order_without_auth() -> None:
    conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",)))
    assert _lines(conf, "http_access") == [
        "http_access deny !allowed_clients",
        "http_access deny CONNECT !connect_ports",
        "http_access deny !CONNECT !safe_ports",
        "http_access deny !CONNECT !plain_http",
        "http_access deny manager",
        "http_access deny blocked_destinations",
        "http_access allow allowed_clients",
        "http_access deny all",
    ]
    assert "auth_param" not in conf
    assert "proxy_auth" not in conf


def test_auth_comes_after_client_and_port_rules() -> None:
    settings = SquidSettings(allowed_clients=("10.0.0.0/8",), auth_username="crawler")
    rules = _lines(render_squid_conf(settings), "http_access")
    # Strangers must get 403 before any 407 challenge; auth before the dst check.
    assert rules.index("http_access deny !authenticated") > rules.index(
        "http_access deny !allowed_clients"
    )
    assert rules.index("http_access deny !authenticated") < rules.index(
        "http_access deny blocked_destinations"
    )
    assert rules[-1] == "http_access deny all"


def test_auth_uses_helper_with_password_file() -> None:
    settings = SquidSettings(
        allowed_clients=("10.0.0.0/8",), auth_username="crawler", password_file="/srv/pw"
    )
    conf = render_squid_conf(settings)
    assert "auth_param basic program /usr/lib/squid/basic_ncsa_auth /srv/pw\n" in conf
    assert "acl authenticated proxy_auth REQUIRED\n" in conf


def test_overlapping_networks_are_collapsed() -> None:
    settings = SquidSettings(
        allowed_clients=("10.1.0.0/16", "10.0.0.0/8", "10.0.0.0/8", "192.168.0.0/24", "::1/128")
    )
    assert _lines(render_squid_conf(settings), "acl allowed_clients") == [
        "acl allowed_clients src 10.0.0.0/8",
        "acl allowed_clients src 192.168.0.0/24",
        "acl allowed_clients src ::1/128",
    ]


def test_port_ranges_are_merged_and_sorted() -> None:
    settings = SquidSettings(
        allowed_clients=("10.0.0.0/8",), connect_ports=("9000-9100", "443", "9050-9200", "444")
    )
    assert _lines(render_squid_conf(settings), "acl connect_ports") == [
        "acl connect_ports port 443-444",
        "acl connect_ports port 9000-9200",
    ]


def test_render_is_deterministic_and_order_independent() -> None:
    a = SquidSettings(
        allowed_clients=("10.0.0.0/8", "172.16.0.0/12"), connect_ports=("443", "8443")
    )
    b = SquidSettings(
        allowed_clients=("172.16.0.0/12", "10.0.0.0/8"), connect_ports=("8443", "443")
    )
    assert render_squid_conf(a) == render_squid_conf(a) == render_squid_conf(b)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (None, "http_port 3128"),
        ("127.0.0.1", "http_port 127.0.0.1:3128"),
        ("::1", "http_port [::1]:3128"),
    ],
)
def test_listen_address(address: str | None, expected: str) -> None:
    conf = render_squid_conf(SquidSettings(allowed_clients=("10.0.0.0/8",), listen_address=address))
    assert _lines(conf, "http_port") == [expected]


def test_paths_are_rendered() -> None:
    settings = SquidSettings(
        allowed_clients=("10.0.0.0/8",),
        pid_file="/t/squid.pid",
        access_log="/t/access.log",
        cache_log="/t/cache.log",
        coredump_dir="/t",
    )
    conf = render_squid_conf(settings)
    for line in (
        "pid_filename /t/squid.pid",
        "access_log daemon:/t/access.log squid",
        "cache_log /t/cache.log",
        "coredump_dir /t",
    ):
        assert f"\n{line}\n" in conf


def test_empty_blocked_destinations_drops_the_rule() -> None:
    conf = render_squid_conf(
        SquidSettings(allowed_clients=("10.0.0.0/8",), blocked_destinations=())
    )
    assert "blocked_destinations" not in conf


def test_default_blocks_loopback_and_metadata() -> None:
    assert "127.0.0.0/8" in DEFAULT_BLOCKED_DESTINATIONS
    assert "169.254.0.0/16" in DEFAULT_BLOCKED_DESTINATIONS


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"allowed_clients": ("10.0.0.0/33",)}, "'10.0.0.0/33'"),
        ({"allowed_clients": ("10.0.0.1/8",)}, "'10.0.0.1/8'"),
        ({"allowed_clients": ("example.com",)}, "'example.com'"),
        ({"allowed_clients": "10.0.0.0/8"}, "tuple"),
        ({"allowed_clients": ()}, "at least one"),
        ({"allowed_clients": ("0.0.0.0/0",)}, "open proxy"),
        ({"port": 0}, "port 0"),
        ({"port": 70000}, "port 70000"),
        ({"port": True}, "port True"),
        ({"connect_ports": ("0",)}, "'0'"),
        ({"connect_ports": ("80-70",)}, "'80-70'"),
        ({"connect_ports": ("443-99999",)}, "'443-99999'"),
        ({"connect_ports": ("https",)}, "'https'"),
        ({"connect_ports": ("1-2-3",)}, "'1-2-3'"),
        ({"connect_ports": ()}, "at least one"),
        ({"safe_ports": ("80 443",)}, "'80 443'"),
        ({"blocked_destinations": ("300.0.0.0/8",)}, "'300.0.0.0/8'"),
        ({"auth_username": "bad user"}, "'bad user'"),
        ({"auth_username": "a:b"}, "'a:b'"),
        ({"auth_username": ""}, "''"),
        ({"auth_username": "x" * 65}, "'xxxx"),
        ({"listen_address": "localhost"}, "'localhost'"),
        ({"visible_hostname": "bad_host"}, "'bad_host'"),
        ({"password_file": "relative/path"}, "'relative/path'"),
        ({"cache_log": "/var/log/x y.log"}, "'/var/log/x y.log'"),
        ({"access_log": "/x\nhttp_access allow all"}, "http_access allow all"),
    ],
)
def test_validation_names_the_bad_value(kwargs: dict[str, object], fragment: str) -> None:
    values: dict[str, object] = {"allowed_clients": ("10.0.0.0/8",), **kwargs}
    with pytest.raises(ValueError) as info:
        SquidSettings(**values)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_open_network_without_auth_needs_explicit_opt_in() -> None:
    settings = SquidSettings(allowed_clients=("0.0.0.0/0",), allow_open_proxy_to_the_internet=True)
    assert "acl allowed_clients src all\n" in render_squid_conf(settings)
    # The flag changes nothing else in the rendered text.
    narrow = SquidSettings(allowed_clients=("10.0.0.0/8",), allow_open_proxy_to_the_internet=True)
    plain = SquidSettings(allowed_clients=("10.0.0.0/8",))
    assert render_squid_conf(narrow) == render_squid_conf(plain)


@pytest.mark.parametrize(
    "clients", [("0.0.0.0/0",), ("::/0",), ("0.0.0.0/0", "::/0", "10.0.0.0/8")]
)
def test_open_network_with_auth_renders_all(clients: tuple[str, ...]) -> None:
    # squid rejects 0.0.0.0/0 ("needs to be replaced by the term 'all'").
    conf = render_squid_conf(SquidSettings(allowed_clients=clients, auth_username="crawler"))
    assert _lines(conf, "acl allowed_clients") == ["acl allowed_clients src all"]


def test_ipv6_network_covering_ipv4_mapped_space_absorbs_ipv4() -> None:
    # squid stores IPv4 as IPv4-mapped IPv6, so ::/1 already holds 10.0.0.0/8
    # and listing both makes squid warn; ::ffff:a.b.c.d forms come out as IPv4.
    settings = SquidSettings(allowed_clients=("10.0.0.0/8", "::/1"))
    assert _lines(render_squid_conf(settings), "acl allowed_clients") == [
        "acl allowed_clients src ::/1"
    ]
    mapped = SquidSettings(allowed_clients=("::ffff:10.0.0.0/104", "10.1.0.0/16"))
    assert _lines(render_squid_conf(mapped), "acl allowed_clients") == [
        "acl allowed_clients src 10.0.0.0/8"
    ]


def test_hash_password_is_bcrypt_and_verifies() -> None:
    hashed = hash_password("correct horse", rounds=4)
    assert hashed.startswith("$2b$04$")
    assert bcrypt.checkpw(b"correct horse", hashed.encode())
    assert not bcrypt.checkpw(b"correct horsE", hashed.encode())
    # Random salt: two hashes of one password differ.
    assert hash_password("correct horse", rounds=4) != hashed


def test_hash_password_default_cost() -> None:
    assert hash_password("pw").startswith("$2b$10$")


@pytest.mark.parametrize(
    ("password", "fragment"),
    [("", "non-empty"), ("s3cr3t-" + "x" * 70, "77 bytes"), ("ab\x00cd", "NUL")],
)
def test_hash_password_rejects_without_echoing(password: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        hash_password(password)
    assert fragment in str(info.value)
    if password:
        assert password not in str(info.value)
        assert "s3cr3t" not in str(info.value)


def test_password_file_line() -> None:
    assert password_file_line("crawler", FIXED_HASH) == f"crawler:{FIXED_HASH}\n"


def test_password_file_line_rejects_bad_username() -> None:
    with pytest.raises(ValueError, match="'bad:name'"):
        password_file_line("bad:name", FIXED_HASH)


@pytest.mark.parametrize("bad_hash", ["plaintext-secret", "$2b$04$has:colon", "$2b$04$x y", ""])
def test_password_file_line_rejects_bad_hash_without_echoing(bad_hash: str) -> None:
    with pytest.raises(ValueError) as info:
        password_file_line("crawler", bad_hash)
    if bad_hash:
        assert bad_hash not in str(info.value)


def test_settings_from_the_stack_config() -> None:
    from proxyinfra.config import Squid
    from proxyinfra.squid import DEFAULT_BLOCKED_DESTINATIONS, settings_from_config

    squid = Squid.model_validate(
        {
            "port": 3130,
            "allowedClients": ["10.0.0.0/8"],
            "connectPorts": ["443", "8443"],
            "auth": {},
        }
    )
    settings = settings_from_config(squid, listen_address="127.0.0.1")
    assert settings.port == 3130
    assert settings.allowed_clients == ("10.0.0.0/8",)
    assert settings.connect_ports == ("443", "8443")
    assert settings.auth_username == "crawler"
    assert settings.listen_address == "127.0.0.1"
    assert settings.blocked_destinations == DEFAULT_BLOCKED_DESTINATIONS
    opened = settings_from_config(squid.model_copy(update={"blocked_destinations": []}))
    assert opened.blocked_destinations == ()
    assert "http_port 3130" in render_squid_conf(settings_from_config(squid))
