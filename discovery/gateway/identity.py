"""Who a gateway client is: its proxy credentials, or its address.

The username says who holds the leases and how (docs/gateway.md):

    HOLDER[-session-ID][-zone-ZONE][-provider-NAME][-label-KEY=VALUE]...

`-session-ID` pins every request and tunnel of that session to one proxy;
the others select proxies as the lease API's selector does. The password is
a discovery token, checked as the API checks a bearer token (hashed, compared
in constant time) and braked per address on the same brake. Clients that can
send no credentials (a browser's `--proxy-server`) are admitted by address
when it lies in one of `--gateway-allow`'s networks: each address is then one
session of its own.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from discovery.brake import Brake, client_key
from discovery.middleware import token_digest, token_matches
from discovery.selection import Selector
from proxyinfra.printable import RULE, refused_character

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_NAME = 128
_PARAMETER = re.compile(r"-(session|zone|provider|label)-")
_SESSION = re.compile(r"[A-Za-z0-9._~-]{1,128}")
ANONYMOUS = "anonymous"
ADMITTED_KEPT = 1024


@dataclass(frozen=True)
class Identity:
    holder: str
    session: str | None = None
    selector: Selector = field(default_factory=Selector)

    @property
    def selector_key(self) -> tuple[str | None, str | None, tuple[tuple[str, str], ...]]:
        s = self.selector
        return (s.provider, s.zone, tuple(sorted(s.labels.items())))

    def describe(self) -> str:
        """The holder as the lease book records it: its session too."""
        return f"{self.holder}-session-{self.session}" if self.session else self.holder


class BadUsername(ValueError):
    """The username does not follow the syntax; the message names the part."""


def _name_problem(value: str) -> str | None:
    """Why a part of the username is no name (the rule of every name that
    reaches a log or a page, proxyinfra/printable.py), or None."""
    if not value or len(value) > MAX_NAME:
        return f"1 to {MAX_NAME} characters"
    character = refused_character(value)
    return None if character is None else f"{character}: {RULE}"


def parse_username(username: str) -> Identity:
    parts = _PARAMETER.split(username)
    holder = parts[0]
    problem = _name_problem(holder)
    if problem is not None:
        raise BadUsername(
            f"the holder (the username before any -session-, -zone-, ...) must be a name: {problem}"
        )
    values: dict[str, str] = {}
    labels: dict[str, str] = {}
    for key, value in zip(parts[1::2], parts[2::2], strict=True):
        problem = _name_problem(value)
        if problem is not None:
            raise BadUsername(f"-{key}- needs a value that is a name: {problem}")
        if key == "label":
            name, sep, label_value = value.partition("=")
            if not sep or not name:
                raise BadUsername("-label- takes KEY=VALUE")
            labels[name] = label_value
            continue
        if key in values:
            raise BadUsername(f"-{key}- is given twice")
        if key == "session" and not _SESSION.fullmatch(value):
            raise BadUsername("a session id is letters, digits and . _ ~ -")
        values[key] = value
    selector = Selector(values.get("provider"), values.get("zone"), labels)
    return Identity(holder, values.get("session"), selector)


@dataclass(frozen=True)
class Refusal:
    status: int  # 400, 407, 429
    reason: str  # the reason header's word
    detail: str
    retry_after: int | None = None


class Admission:
    """Decides who may use the gateway. `token` None: the service has no token
    (loopback only): anyone may, and a password is not checked."""

    def __init__(self, token: str | None, brake: Brake, allow: Sequence[Network] = ()) -> None:
        self._digest = token_digest(token) if token else None
        self.brake = brake
        self.allow = tuple(allow)
        # Headers admitted before (token right, username parsed), by value, the
        # least recently used dropped first: neither a request on a kept
        # connection nor a new connection per tunnel hashes or parses it again.
        # The brake is asked first all the same.
        self._admitted: OrderedDict[bytes, Identity] = OrderedDict()

    def allowed(self, address: str | None) -> bool:
        if not address or not self.allow:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.allow)

    def admit(self, authorization: bytes | None, address: str | None) -> Identity | Refusal:
        if authorization is None:
            if self.allowed(address):
                # A browser: its address is its session.
                key = client_key(address)
                return Identity(f"address-{key}", key)
            if self._digest is None:
                return Identity(ANONYMOUS)
            return Refusal(407, "auth_required", "proxy credentials required: USER:TOKEN")
        credentials = _basic(authorization)
        if credentials is None:
            return Refusal(407, "auth_required", "Proxy-Authorization must be Basic USER:TOKEN")
        username, password = credentials
        if self._digest is not None:
            wait = self.brake.retry_after(address)
            if wait:
                detail = self.brake.refusal_detail(address, wait)
                return Refusal(429, "too_many_wrong_tokens", detail, wait)
        known = self._admitted.get(authorization)
        if known is not None:  # this very header was admitted before
            self._admitted.move_to_end(authorization)
            return known
        if self._digest is not None:
            if not token_matches(password, self._digest):
                self.brake.failed(address, "gateway")
                return Refusal(407, "wrong_token", "wrong token (the proxy password)")
            self.brake.succeeded(address)
        try:
            identity = parse_username(username)
        except BadUsername as exc:
            return Refusal(400, "bad_username", f"username: {exc}")
        self._admitted[authorization] = identity
        if len(self._admitted) > ADMITTED_KEPT:
            self._admitted.popitem(last=False)
        return identity


def _basic(value: bytes) -> tuple[str, bytes] | None:
    scheme, _, encoded = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        raw = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    username, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return username.decode(), password
    except UnicodeDecodeError:
        return None


__all__ = [
    "ANONYMOUS",
    "Admission",
    "BadUsername",
    "Identity",
    "Network",
    "Refusal",
    "parse_username",
]
