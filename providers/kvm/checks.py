"""Rules on a kvm provider entry and on the proxies placed on it, beyond its
model's: files, host names, libvirt's rules on the host fields
(providers/kvm/rules.py) and placement. Reported with every other config
error before any resource is registered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from providers.kvm.config import KvmApt, KvmProviderEntry
from providers.kvm.rules import bridge_problem, cpu_mode_problem, network_problem
from proxyinfra.checks import Report, file_exists, one_of
from proxyinfra.config import ProxyEntry


def check_provider(provider: KvmProviderEntry, path: str, c: Report) -> None:
    kvm = provider.kvm
    file_exists(kvm.ssh_key_file, f"{path}.kvm.sshKeyFile", c)
    if kvm.known_hosts_file is not None:
        file_exists(kvm.known_hosts_file, f"{path}.kvm.knownHostsFile", c)
    elif not kvm.insecure_ignore_host_key:
        c.add(
            f"{path}.kvm.knownHostsFile",
            "required (or set insecureIgnoreHostKey: true, which accepts any host key)",
        )
    if kvm.insecure_ignore_host_key:
        c.warnings.append(
            f"{path}.kvm.insecureIgnoreHostKey is true: host keys of provider "
            f"{provider.name!r} are not verified, so anyone who can intercept the SSH "
            "connection can impersonate the host and take over libvirt"
        )
    if kvm.apt is not None:
        _check_apt(kvm.apt, f"{path}.kvm.apt", c)
    seen: set[str] = set()
    for j, host in enumerate(kvm.hosts):
        hpath = f"{path}.kvm.hosts[{j}]"
        if host.name in seen:
            c.add(f"{hpath}.name", f"duplicate host name {host.name!r}")
        seen.add(host.name)
        if (host.bridge is None) == (host.network is None):
            both = "both set" if host.bridge else "neither set"
            c.add(hpath, f"set exactly one of bridge or network ({both})")
        for key, value, rule in (
            ("cpuMode", host.cpu_mode, cpu_mode_problem),
            ("bridge", host.bridge, bridge_problem),
            ("network", host.network, network_problem),
        ):
            if value is not None and (problem := rule(value)):
                c.add(f"{hpath}.{key}", f"{value!r} {problem}")


def _url_problem(value: str) -> str | None:
    """What is wrong with an apt URL, in words that never repeat it."""
    try:
        parts = urlsplit(value)
        parts.hostname  # noqa: B018 (raises for a malformed IPv6 host)
    except ValueError:
        return "must be an http(s) URL (it does not parse as one)"
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in value)
    ):
        return (
            f"must be an http(s) URL (got scheme {parts.scheme or 'none'!r}, "
            f"host {parts.hostname or 'none'!r})"
        )
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials: they would be written into every VM's apt configuration"
    return None


def _check_apt(apt: KvmApt, path: str, c: Report) -> None:
    if apt.mirror is None and apt.proxy is None:
        c.add(path, "give a mirror, a proxy or both")
    for key, value in (
        ("mirror", apt.mirror),
        ("securityMirror", apt.security_mirror),
        ("proxy", apt.proxy),
    ):
        if value is not None and (problem := _url_problem(value)):
            c.add(f"{path}.{key}", problem)
    if apt.mirror is None:
        for key, value in (("securityMirror", apt.security_mirror), ("key", apt.key)):
            if value is not None:
                c.add(f"{path}.{key}", "only with a mirror (apt.mirror)")


@dataclass(frozen=True)
class Targets:
    """What kvm placement may name; taken leniently from the raw entry when the
    provider itself has errors, so placement errors are still all reported."""

    provider: str
    hosts: list[str]
    machine_types: list[str]
    images: list[str]

    @classmethod
    def of(cls, provider: KvmProviderEntry) -> Targets:
        kvm = provider.kvm
        hosts = [h.name for h in kvm.hosts]
        return cls(provider.name, hosts, list(kvm.machine_types), list(kvm.images))

    @classmethod
    def of_raw(cls, entry: Mapping[str, Any]) -> Targets:
        kvm = entry.get("kvm") if isinstance(entry.get("kvm"), Mapping) else {}
        assert isinstance(kvm, Mapping)

        def keys(key: str) -> list[str]:
            value = kvm.get(key)
            return [str(k) for k in value] if isinstance(value, Mapping) else []

        raw_hosts = kvm.get("hosts")
        hosts = [
            str(h["name"])
            for h in (raw_hosts if isinstance(raw_hosts, list) else [])
            if isinstance(h, Mapping) and "name" in h
        ]
        return cls(str(entry.get("name")), hosts, keys("machineTypes"), keys("images"))


def check_placement(proxy: ProxyEntry, kvm: Targets, path: str, c: Report) -> None:
    hosts = kvm.hosts
    zone = proxy.placement.zone
    if zone is None and len(hosts) > 1:
        c.add(
            f"{path}.placement.zone",
            f"required when provider {kvm.provider!r} has several hosts (hosts: {', '.join(hosts)})",
        )
    elif zone is not None and zone not in hosts:
        c.add(f"{path}.placement.zone", f"unknown host {zone!r} (hosts: {', '.join(hosts)})")
    one_of(
        proxy.placement.machine_type,
        kvm.machine_types,
        "machineTypes",
        f"{path}.placement.machineType",
        c,
    )
    image = proxy.placement.image
    if image is None or (image not in kvm.images and not is_http_url(image)):
        listed = ", ".join(kvm.images) or "none defined"
        what = "required" if image is None else f"unknown image {image!r}"
        c.add(f"{path}.placement.image", f"{what} (images: {listed}; or an http(s) URL)")


def is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)
