"""The one squid.conf renderer every backend uses, and the NCSA password file.

The proxy is a plain forward proxy for crawlers: it admits only the configured
client networks, tunnels CONNECT only to the configured ports, forwards plain
HTTP only to "safe" ports, caches nothing and does not tell origin servers who
the client is.  Rendering is deterministic: the same settings give the same
bytes, so `pulumi preview` shows no spurious diffs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

import bcrypt

from proxyinfra.config import Squid

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Destinations a crawler never needs and an attacker-controlled URL could aim
# at: the proxy host itself, cloud metadata (169.254.169.254) and private
# networks (a VPC, a Kubernetes cluster).  Tests on loopback override this.
DEFAULT_BLOCKED_DESTINATIONS: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "::/128",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
)

# Plain HTTP may go to the web's usual ports and to unregistered ones (as in
# Debian's stock config); never to e.g. SMTP (25) or SSH (22).
DEFAULT_SAFE_PORTS: tuple[str, ...] = ("80", "443", "1025-65535")

DEFAULT_PASSWORD_FILE = "/etc/squid/passwords"

# bcrypt only looks at the first 72 bytes; bcrypt 5 refuses longer input.
_BCRYPT_MAX_BYTES = 72
# Safe in the password file ("user:hash") and unquoted in a proxy URL.
_USERNAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")
# A crypt(3) string: "$id$...", no separator (':') or whitespace inside.
_CRYPT_HASH_RE = re.compile(r"\$[0-9a-z]+\$[^\s:]+")


@dataclass(frozen=True, kw_only=True)
class SquidSettings:
    """Everything squid.conf depends on; paths default to Debian's layout."""

    allowed_clients: tuple[str, ...]
    port: int = 3128
    connect_ports: tuple[str, ...] = ("443",)
    safe_ports: tuple[str, ...] = DEFAULT_SAFE_PORTS
    auth_username: str | None = None
    blocked_destinations: tuple[str, ...] = DEFAULT_BLOCKED_DESTINATIONS
    # None listens on every address (production); tests bind "127.0.0.1".
    listen_address: str | None = None
    # Shown in error pages instead of the machine's name (and squid needs one).
    visible_hostname: str = "egress-proxy"
    password_file: str = DEFAULT_PASSWORD_FILE
    auth_program: str = "/usr/lib/squid/basic_ncsa_auth"
    pid_file: str = "/run/squid.pid"
    access_log: str = "/var/log/squid/access.log"
    cache_log: str = "/var/log/squid/cache.log"
    coredump_dir: str = "/var/spool/squid"
    # Only with this may a /0 network be admitted without auth (stack config
    # squid.allowOpenProxyToTheInternet); nothing else depends on it.
    allow_open_proxy_to_the_internet: bool = False

    def __post_init__(self) -> None:
        _check_port("port", self.port)
        clients = parse_networks("allowed_clients", self.allowed_clients)
        if not clients:
            raise ValueError("allowed_clients must name at least one CIDR")
        open_to_all = any(n.prefixlen == 0 for n in clients)
        if open_to_all and self.auth_username is None and not self.allow_open_proxy_to_the_internet:
            raise ValueError(
                "allowed_clients admits every address (a /0 network) without auth: that is "
                "an open proxy; set auth_username, narrow the networks, or set "
                "allow_open_proxy_to_the_internet"
            )
        parse_port_ranges("connect_ports", self.connect_ports, allow_empty=False)
        parse_port_ranges("safe_ports", self.safe_ports, allow_empty=False)
        parse_networks("blocked_destinations", self.blocked_destinations)
        if self.auth_username is not None:
            check_username(self.auth_username)
        if self.listen_address is not None:
            _check_ip("listen_address", self.listen_address)
        check_hostname("visible_hostname", self.visible_hostname)
        for name in ("password_file", "auth_program", "pid_file", "access_log", "cache_log"):
            _check_path(name, getattr(self, name))
        _check_path("coredump_dir", self.coredump_dir)


def settings_from_config(squid: Squid, **overrides: object) -> SquidSettings:
    """The renderer's settings for the stack's `squid` block (paths may be overridden)."""
    values: dict[str, object] = {
        "allowed_clients": tuple(squid.allowed_clients),
        "port": squid.port,
        "connect_ports": tuple(squid.connect_ports),
        "auth_username": squid.auth.username if squid.auth else None,
        "allow_open_proxy_to_the_internet": squid.allow_open_proxy_to_the_internet,
    }
    if squid.blocked_destinations is not None:
        values["blocked_destinations"] = tuple(squid.blocked_destinations)
    values.update(overrides)
    return SquidSettings(**values)  # type: ignore[arg-type]


def check_username(username: str) -> None:
    """Reject names that would break the password file or a proxy URL."""
    if not isinstance(username, str) or not _USERNAME_RE.fullmatch(username):
        raise ValueError(
            f"auth username {username!r} is invalid: use 1-64 characters from A-Z a-z 0-9 . _ -"
        )


def check_hostname(field: str, value: str) -> None:
    """Reject anything but a DNS host name (labels of letters, digits, '-')."""
    if not isinstance(value, str) or len(value) > 253 or not _HOSTNAME_RE.fullmatch(value):
        raise ValueError(f"{field} {value!r} is not a host name")


def parse_networks(field: str, values: Iterable[str]) -> list[IPNetwork]:
    """CIDR strings to networks; the error names the field and the bad value."""
    _check_sequence(field, values)
    networks: list[IPNetwork] = []
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"{field}: {value!r} is not a CIDR string")
        try:
            networks.append(ipaddress.ip_network(value, strict=True))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{field}: {value!r} is not a CIDR network ({exc})") from None
    return networks


def parse_port_ranges(
    field: str, values: Iterable[str], *, allow_empty: bool = True
) -> list[tuple[int, int]]:
    """Port strings ("443" or "lo-hi") to (lo, hi) pairs, validated."""
    _check_sequence(field, values)
    ranges: list[tuple[int, int]] = []
    for value in values:
        ranges.append(_parse_port_range(field, value))
    if not ranges and not allow_empty:
        raise ValueError(f"{field} must name at least one port")
    return ranges


def _parse_port_range(field: str, value: str) -> tuple[int, int]:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,5}(-[0-9]{1,5})?", value):
        raise ValueError(f'{field}: {value!r} is not a port ("443") or a range ("8000-8999")')
    lo_text, _, hi_text = value.partition("-")
    lo, hi = int(lo_text), int(hi_text or lo_text)
    for port in (lo, hi):
        if not 1 <= port <= 65535:
            raise ValueError(f"{field}: {value!r} has port {port} outside 1-65535")
    if lo > hi:
        raise ValueError(f"{field}: {value!r} is an empty range (low end above high end)")
    return lo, hi


def _check_sequence(field: str, values: object) -> None:
    # A bare string is iterable too; catch it before it is read char by char.
    if isinstance(values, str) or not isinstance(values, tuple | list):
        raise ValueError(f"{field} must be a tuple of strings, got {values!r}")


def _check_port(field: str, port: object) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{field} {port!r} is not a TCP port (1-65535)")


def _check_ip(field: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{field} {value!r} is not an IP address") from None


def _check_path(field: str, value: str) -> None:
    # squid.conf splits on whitespace; a newline would even inject directives.
    if not isinstance(value, str) or not value.startswith("/") or re.search(r'[\s"#]', value):
        raise ValueError(f"{field} {value!r} must be an absolute path without spaces, quotes or #")


_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _as_v6(network: IPNetwork) -> ipaddress.IPv6Network:
    if isinstance(network, ipaddress.IPv6Network):
        return network
    return ipaddress.IPv6Network(f"::ffff:{network.network_address}/{96 + network.prefixlen}")


def _from_v6(network: ipaddress.IPv6Network) -> IPNetwork:
    if not network.subnet_of(_V4_MAPPED):
        return network
    address = ipaddress.IPv4Address(int(network.network_address) & 0xFFFFFFFF)
    return ipaddress.IPv4Network(f"{address}/{network.prefixlen - 96}")


def _collapsed(networks: list[IPNetwork]) -> list[str]:
    # squid warns about (and ignores) a network inside another one in the same
    # ACL, so render the smallest equivalent set.  squid keeps IPv4 addresses
    # as IPv4-mapped IPv6, so overlaps are found in that space too (::/1
    # holds every IPv4 address), and it rejects 0.0.0.0/0 in favour of "all".
    if any(n.prefixlen == 0 for n in networks):
        return ["all"]
    merged = [_from_v6(n) for n in ipaddress.collapse_addresses(_as_v6(n) for n in networks)]
    v4 = sorted(n for n in merged if isinstance(n, ipaddress.IPv4Network))
    v6 = sorted(n for n in merged if isinstance(n, ipaddress.IPv6Network))
    return [str(n) for n in [*v4, *v6]]


def _merged_ports(ranges: list[tuple[int, int]]) -> list[str]:
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged]


def _acl_lines(name: str, kind: str, values: list[str]) -> list[str]:
    return [f"acl {name} {kind} {value}" for value in values]


def _http_port_line(settings: SquidSettings) -> str:
    if settings.listen_address is None:
        return f"http_port {settings.port}"
    address = ipaddress.ip_address(settings.listen_address)
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http_port {host}:{settings.port}"


def _auth_lines(settings: SquidSettings) -> list[str]:
    if settings.auth_username is None:
        return []
    return [
        "",
        "# Basic auth against an NCSA file of crypt(3) (bcrypt) hashes.",
        f"auth_param basic program {settings.auth_program} {settings.password_file}",
        "auth_param basic children 5 startup=1 idle=1",
        f"auth_param basic realm {settings.visible_hostname}",
        "auth_param basic credentialsttl 5 minutes",
        "acl authenticated proxy_auth REQUIRED",
    ]


def _access_lines(settings: SquidSettings, has_blocked: bool) -> list[str]:
    # Order matters: strangers get 403 before any auth challenge (no 407 tells
    # them a realm exists), port/protocol rules before auth, and the slow dst
    # check (it may need DNS) only for authenticated clients.
    lines = [
        "",
        "# First match wins.",
        "http_access deny !allowed_clients",
        "http_access deny CONNECT !connect_ports",
        "http_access deny !CONNECT !safe_ports",
        "http_access deny !CONNECT !plain_http",
        "http_access deny manager",
    ]
    if settings.auth_username is not None:
        lines.append("http_access deny !authenticated")
    if has_blocked:
        lines.append("http_access deny blocked_destinations")
    lines += ["http_access allow allowed_clients", "http_access deny all"]
    return lines


def render_squid_conf(settings: SquidSettings) -> str:
    """squid.conf text for these settings (deterministic)."""
    clients = _collapsed(parse_networks("allowed_clients", settings.allowed_clients))
    blocked = _collapsed(parse_networks("blocked_destinations", settings.blocked_destinations))
    connect = _merged_ports(parse_port_ranges("connect_ports", settings.connect_ports))
    safe = _merged_ports(parse_port_ranges("safe_ports", settings.safe_ports))
    lines = [
        "# Generated by egress-proxies; local changes are overwritten.",
        _http_port_line(settings),
        f"visible_hostname {settings.visible_hostname}",
        "",
        "# Needed in containers: the default takes the (huge) fd limit and",
        "# allocates per-fd tables up front; keep memory small too.",
        "max_filedescriptors 1024",
        "cache_mem 16 MB",
        "",
        "# A forward proxy for crawlers: store nothing.",
        "cache deny all",
        "",
        "# Privacy: origins learn nothing about the client or the proxy software.",
        "forwarded_for delete",
        # 'via off' makes squid warn that HTTP requires Via; dropping the
        # header on the way out has the same effect without the warning.
        "request_header_access Via deny all",
        # squid adds "Cache-Control: max-age=..." to requests that carry none,
        # which marks them as proxied: pass on only what the client sent.
        "acl client_cache_control req_header Cache-Control .",
        "request_header_access Cache-Control deny !client_cache_control",
        "httpd_suppress_version_string on",
        "",
        *_acl_lines("allowed_clients", "src", clients),
        *_acl_lines("connect_ports", "port", connect),
        *_acl_lines("safe_ports", "port", safe),
        "acl plain_http proto HTTP",
        *_acl_lines("blocked_destinations", "dst", blocked),
        *_auth_lines(settings),
        *_access_lines(settings, bool(blocked)),
        "",
        "# Files; rotation is logrotate's job (Debian), not squid's.",
        f"pid_filename {settings.pid_file}",
        f"access_log daemon:{settings.access_log} squid",
        f"cache_log {settings.cache_log}",
        f"coredump_dir {settings.coredump_dir}",
        "logfile_rotate 0",
        "",
        "# No ICMP pinger (needs privileges, useless here); quick restarts.",
        "pinger_enable off",
        "shutdown_lifetime 5 seconds",
    ]
    return "\n".join(lines) + "\n"


def hash_password(password: str, *, rounds: int = 10) -> str:
    """A bcrypt ($2b$) hash that basic_ncsa_auth checks through crypt(3).

    The salt is random: hash once and keep the result, or every render differs.
    The password itself never appears in an error message.
    """
    if not isinstance(password, str) or not password:
        raise ValueError("password must be a non-empty string")
    raw = password.encode("utf-8")
    if len(raw) > _BCRYPT_MAX_BYTES:
        raise ValueError(
            f"password is {len(raw)} bytes long; bcrypt uses at most {_BCRYPT_MAX_BYTES}"
        )
    if b"\x00" in raw:
        raise ValueError("password must not contain a NUL character")
    return bcrypt.hashpw(raw, bcrypt.gensalt(rounds=rounds)).decode("ascii")


def password_file_line(username: str, password_hash: str) -> str:
    """One "user:hash" line of squid's NCSA password file, newline included."""
    check_username(username)
    if not isinstance(password_hash, str) or not _CRYPT_HASH_RE.fullmatch(password_hash):
        # Do not echo the hash: it is secret material.
        raise ValueError(f"password hash for {username!r} is not a crypt(3) hash such as $2b$...")
    return f"{username}:{password_hash}\n"
