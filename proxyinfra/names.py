"""Deterministic names of everything the fleet puts on a host.

A proxy's id is derived from project, stack and logical replica name, so two
stacks can share a libvirt host (or a GCP project, or a namespace) without
colliding, and the same replica keeps its id across runs. The logical name
carries the replica's generation (``home-0``, then ``home-0-g2``:
proxyinfra/generations.py), so a recycled replica gets a new id, and with it
a new MAC, domain, volumes and instance.
"""

from __future__ import annotations

import hashlib

PROXY_PREFIX = "proxy-"
BASE_PREFIX = "egress-base-"


def _hex(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def proxy_id(project: str, stack: str, logical_name: str) -> str:
    """``proxy-<10 hex>``: 40 bits, collision-free in practice for fleets of thousands."""
    return PROXY_PREFIX + _hex(f"{project}\0{stack}\0{logical_name}", 10)


def overlay_volume(proxy: str) -> str:
    return f"{proxy}.qcow2"


def seed_volume(proxy: str) -> str:
    return f"{proxy}-seed.iso"


def base_volume(url: str, sha256: str | None, fmt: str) -> str:
    """Base images are named by content: the configured digest when there is one,
    else the URL (a "latest" URL is pinned per host at first fetch). A changed
    url or sha256 therefore lands beside the old base instead of over it."""
    key = sha256[:16] if sha256 else "u" + _hex(url, 15)
    return f"{BASE_PREFIX}{key}.{fmt}"


def base_marker_volume(base: str) -> str:
    """Written last, holding the digest: a base without it is a broken download."""
    return f"{base}.sha256"
