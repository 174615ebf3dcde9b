"""Crawl targets: a URL or a host name, reduced to the host name that
cooldowns are kept for.

One regular expression says what a target may look like; the API's schema
publishes the same one, so what the document calls valid the service
accepts (the service adds one rule a regular expression cannot say well: a
host name of at most 253 characters). Host names are ASCII (an
internationalised name in its `xn--` form) of labels of at most 63
characters, the last beginning with a letter (`1.2.3.999` is no name and no
address); IP literals are IPv4 dotted quads or bracketed IPv6 addresses;
ports run from 1 to 65535. A refused target is described in a few words,
never by the expression.
"""

from __future__ import annotations

import ipaddress
import re

EVERYWHERE = "*"  # the cooldown scope of a `blocked` report that names no target

MAX_HOST_LENGTH = 253
MAX_LABEL_LENGTH = 63

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    """RFC 3986's IPv6address: eight groups, or fewer around one `::`."""
    forms = [rf"(?:{_H16}:){{6}}{_LS32}"]
    tails = [f"(?:{_H16}:){{5}}{_LS32}", f"(?:{_H16}:){{4}}{_LS32}"]
    tails += [f"(?:{_H16}:){{3}}{_LS32}", f"(?:{_H16}:){{2}}{_LS32}", f"{_H16}:{_LS32}"]
    tails += [_LS32, _H16, ""]
    for before, tail in enumerate(tails):  # at most `before` groups before the `::`
        head = f"(?:(?:{_H16}:){{0,{before - 1}}}{_H16})?" if before else ""
        forms.append(f"{head}::{tail}")
    return "(?:" + "|".join(forms) + ")"


_IPV6 = _ipv6()
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_LAST_LABEL = r"[A-Za-z_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_NAME = rf"(?:{_LABEL}\.)*{_LAST_LABEL}\.?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# Explicit character ranges, not \s: Python's and the schema validator's ideas
# of white space differ.
TARGET_PATTERN = (
    r"^(?:[A-Za-z][A-Za-z0-9+.-]*://)?"  # scheme
    r"(?:[^\x00-\x20\x7f/?#@\[\]]*@)?"  # user info
    rf"(\[{_IPV6}\]|{_IPV4}|{_NAME})"  # host
    rf"(?::{_PORT})?"  # port
    r"(?:[/?#][^\x00-\x20\x7f]*)?$"  # path, query, fragment
)
_TARGET = re.compile(TARGET_PATTERN)
# The same parts, loosely: to say what is wrong with a target that fails the above.
_PARTS = re.compile(
    r"(?:[A-Za-z][A-Za-z0-9+.-]*://)?(?:[^/?#@]*@)?(\[[^\]]*\]?|[^:/?#]*)(?::([^/?#]*))?(.*)",
    re.DOTALL,
)
_NAME_CHARACTERS = re.compile(r"[A-Za-z0-9_.-]*")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")


def problem(target: str) -> str | None:
    """What is wrong with `target`, in a few words; None when nothing is."""
    return _check(target)[1]


def _check(target: str) -> tuple[re.Match[str] | None, str | None]:
    match = _TARGET.fullmatch(target)
    if match is None:
        return None, _diagnosis(target)
    if len(match.group(1).rstrip(".")) > MAX_HOST_LENGTH:
        return None, f"the host name is longer than {MAX_HOST_LENGTH} characters"
    return match, None


def _diagnosis(target: str) -> str:
    if not target:
        return "it is empty"
    if any(c <= " " or c == "\x7f" for c in target):
        return "it contains white space or control characters"
    if not target.isascii():
        return "host names are ASCII (write an internationalised name in its xn-- form)"
    parts = _PARTS.fullmatch(target)
    if parts is None:  # pragma: no cover - the loose expression matches every string
        return "it is not a URL or a host name"
    host, port, _ = parts.groups()
    if not host:
        return "it names no host"
    if host.startswith("["):
        return "the host in brackets is not an IPv6 address"
    if port is not None and not re.fullmatch(_PORT, port):
        return "the port is not a number from 1 to 65535"
    name = host.rstrip(".") if host != "." else host
    if _DOTTED_NUMBERS.fullmatch(host) and host.endswith("."):
        return "an IPv4 address has no trailing dot"
    if _DOTTED_NUMBERS.fullmatch(name):
        return "the host is not an IPv4 address (four numbers from 0 to 255, no leading zeros)"
    if len(name) > MAX_HOST_LENGTH:
        return f"the host name is longer than {MAX_HOST_LENGTH} characters"
    if not _NAME_CHARACTERS.fullmatch(name):
        return "the host name has characters other than letters, digits, '-', '_' and '.'"
    labels = name.split(".")
    if any(not label for label in labels):
        return "the host name has an empty label"
    if any(len(label) > MAX_LABEL_LENGTH for label in labels):
        return f"a label of the host name is longer than {MAX_LABEL_LENGTH} characters"
    if any(label.startswith("-") or label.endswith("-") for label in labels):
        return "a label of the host name begins or ends with '-'"
    if not re.fullmatch(_LAST_LABEL, labels[-1]):
        return "the last label of the host name does not begin with a letter"
    return "it is not a URL or a host name"


def host_of(target: str) -> str:
    """The normalised host name of `target` ('https://WWW.Example.com:8443/x' ->
    'www.example.com'); raises ValueError, saying why, when `target` is no URL or
    host name."""
    match, reason = _check(target)
    if match is None:
        raise ValueError(f"target is not a URL or a host name: {reason}")
    host = match.group(1)
    host = host[1:-1] if host.startswith("[") else host.rstrip(".")
    try:
        return str(ipaddress.ip_address(host))  # one spelling per address
    except ValueError:
        return host.lower()
