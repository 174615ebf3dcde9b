"""Crawl targets: a URL or a host name, reduced to the host name that
cooldowns are kept for.

One regular expression says what a target may look like; the API's schema
publishes the same one, so what the document calls valid the service
accepts. Host names are ASCII (an internationalised name in its `xn--`
form) or IP literals.
"""

from __future__ import annotations

import ipaddress
import re

EVERYWHERE = "*"  # the cooldown scope of a `blocked` report that names no target

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
# Explicit character ranges, not \s: Python's and the schema validator's (Rust)
# ideas of white space differ.
TARGET_PATTERN = (
    r"^(?:[A-Za-z][A-Za-z0-9+.-]*://)?"  # scheme
    r"(?:[^\x00-\x20\x7f/?#@\[\]]*@)?"  # user info
    rf"(\[[0-9A-Fa-f:.]+\]|{_LABEL}(?:\.{_LABEL})*\.?)"  # host
    r"(?::[0-9]{1,5})?"  # port
    r"(?:[/?#][^\x00-\x20\x7f]*)?$"  # path, query, fragment
)
_TARGET = re.compile(TARGET_PATTERN)


def host_of(target: str) -> str:
    """The normalised host name of `target` ('https://WWW.Example.com:8443/x' ->
    'www.example.com'); raises ValueError when `target` is no URL or host name."""
    match = _TARGET.match(target)
    if match is None:
        raise ValueError(f"target {target!r} is not a URL or a host name")
    host = match.group(1)
    host = host[1:-1] if host.startswith("[") else host.rstrip(".")
    try:
        return str(ipaddress.ip_address(host))  # one spelling per address
    except ValueError:
        return host.lower()
