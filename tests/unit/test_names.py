"""Deterministic names."""

from __future__ import annotations

import re

from providers.kvm.gc import BASE_RE
from proxyinfra import names


def test_proxy_id_is_stable_and_scoped_by_project_and_stack() -> None:
    a = names.proxy_id("egress-proxies", "dev", "home-0")
    assert re.fullmatch(r"proxy-[0-9a-f]{10}", a)
    assert a == names.proxy_id("egress-proxies", "dev", "home-0")
    # A pinned value: changing the derivation would rename every proxy on every host.
    assert a == "proxy-2a5164b456"
    others = {
        names.proxy_id("egress-proxies", "prod", "home-0"),
        names.proxy_id("other", "dev", "home-0"),
        names.proxy_id("egress-proxies", "dev", "home-1"),
    }
    assert a not in others and len(others) == 3


def test_separator_prevents_ambiguous_joins() -> None:
    assert names.proxy_id("a", "b-c", "d") != names.proxy_id("a-b", "c", "d")


def test_volume_names() -> None:
    pid = names.proxy_id("egress-proxies", "dev", "home-0")
    assert names.overlay_volume(pid) == f"{pid}.qcow2"
    assert names.seed_volume(pid) == f"{pid}-seed.iso"
    digest = "ab" * 32
    base = names.base_volume("https://x/img.qcow2", digest, "qcow2")
    assert base == f"egress-base-{digest[:16]}.qcow2"
    assert names.base_marker_volume(base) == base + ".sha256"
    # Without a digest the URL names it; a different URL or a digest gives another base.
    by_url = names.base_volume("https://x/img.qcow2", None, "qcow2")
    assert re.fullmatch(r"egress-base-u[0-9a-f]{15}\.qcow2", by_url)
    assert by_url != names.base_volume("https://x/other.qcow2", None, "qcow2")
    assert by_url != base
    assert names.base_volume("https://x/img.raw", digest, "raw").endswith(".raw")


def test_gc_recognises_every_base_name_and_nothing_else() -> None:
    for fmt in ("qcow2", "raw"):
        for sha in (None, "ab" * 32):
            name = names.base_volume("https://images.example/debian.qcow2", sha, fmt)
            assert BASE_RE.match(name), name
            assert not BASE_RE.match(names.base_marker_volume(name))
    assert not BASE_RE.match("egress-base-xyz.qcow2")
    assert not BASE_RE.match("proxy-0123456789.qcow2")
