"""Stack configs for the tests: the dicts a ``Pulumi.<stack>.yaml`` holds under
the ``egress-proxies`` namespace (README, "Stack config").

The one place the tests spell the config's keys: every test builds its kvm
providers, proxies and squid block here, so renaming a key is one edit. A
test that is about a key (a typo, a missing field, a wrong value) still names
that key itself, on a config built here.

Hosts are at documentation addresses (192.0.2.0/24, RFC 5737) unless the
testbed's own entry is used: nothing is ever reached there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from proxyinfra.stackfile import NAMESPACE
from tests.support.testbed import Testbed

UNREACHABLE_IMAGE = "http://img.invalid/d.qcow2"  # .invalid never resolves (RFC 2606)


def given(**keys: Any) -> dict[str, Any]:
    """KEYS without those left None: the config keys a builder was given
    (the others are not written, so their defaults apply)."""
    return {key: value for key, value in keys.items() if value is not None}


def key_files(directory: Path) -> tuple[Path, Path]:
    """An SSH key and a known_hosts file in DIRECTORY, for hosts that are never
    contacted (validation wants both to exist; nothing reads them)."""
    key, known = directory / "key", directory / "known"
    key.write_text("not used: no host is contacted\n")
    known.write_text("")
    return key, known


def host(
    name: str = "nas1",
    address: str = "192.0.2.1:22",
    *,
    user: str = "virt",
    network: str = "n",
    bridge: str | None = None,
    socket: str | None = None,
    pool: str | None = None,
    domain_type: str | None = None,
    cpu_mode: str | None = None,
) -> dict[str, Any]:
    """One `hosts[]` entry: the VMs' NIC on a libvirt NETWORK, or on BRIDGE
    instead; the keys left None are not written (their defaults apply)."""
    nic = {"bridge": bridge} if bridge is not None else {"network": network}
    return (
        {"name": name, "address": address, "user": user}
        | nic
        | given(socket=socket, pool=pool, domainType=domain_type, cpuMode=cpu_mode)
    )


def machine_type(vcpus: int = 1, memory_mib: int = 512) -> dict[str, Any]:
    return {"vcpus": vcpus, "memoryMiB": memory_mib}


def image(url: str, sha256: str | None = None) -> dict[str, Any]:
    return {"url": url} if sha256 is None else {"url": url, "sha256": sha256}


def kvm_provider(
    key_file: str | Path,
    known_hosts: str | Path | None = None,
    *,
    name: str = "home",
    hosts: Sequence[dict[str, Any]] | None = None,
    images: Mapping[str, dict[str, Any]] | None = None,
    machine_types: Mapping[str, dict[str, Any]] | None = None,
    insecure: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """A `type: kvm` provider entry: one host (`nas1`), image `d` and machine
    type `s` unless given (`{}`: none); without KNOWN_HOSTS the entry names
    no known_hosts file (INSECURE then ignores host keys). OPTIONS as
    `set_kvm` takes them."""
    kvm: dict[str, Any] = {"sshKeyFile": str(key_file)}
    if known_hosts is not None:
        kvm["knownHostsFile"] = str(known_hosts)
    if insecure:
        kvm["insecureIgnoreHostKey"] = True
    images = {"d": image(UNREACHABLE_IMAGE)} if images is None else images
    machine_types = {"s": machine_type()} if machine_types is None else machine_types
    if images:
        kvm["images"] = dict(images)
    if machine_types:
        kvm["machineTypes"] = dict(machine_types)
    kvm["hosts"] = list(hosts or [host()])
    provider = {"name": name, "type": "kvm", "kvm": kvm}
    return set_kvm(provider, **options)


def set_kvm(
    provider: dict[str, Any],
    *,
    images: Mapping[str, dict[str, Any]] | None = None,
    machine_types: Mapping[str, dict[str, Any]] | None = None,
    ip_timeout: int | None = None,
    vendor_data: str | None = None,
    apt: dict[str, Any] | None = None,
    bridge: str | None = None,
) -> dict[str, Any]:
    """PROVIDER (a kvm entry) with these set, in place and returned; BRIDGE
    moves the first host's NIC from its network to that bridge."""
    kvm = provider["kvm"]
    if images is not None:
        kvm["images"] = dict(images)
    if machine_types is not None:
        kvm["machineTypes"] = dict(machine_types)
    if ip_timeout is not None:
        kvm["ipTimeoutSeconds"] = ip_timeout
    if vendor_data is not None:
        kvm["vendorData"] = vendor_data
    if apt is not None:
        kvm["apt"] = apt
    if bridge is not None:
        first = kvm["hosts"][0]
        first.pop("network", None)
        first["bridge"] = bridge
    return provider


def the_testbed_provider(testbed: Testbed, **options: Any) -> dict[str, Any]:
    """The testbed's kvm provider entry (the provider.yaml `scripts/testbed up`
    writes, provider `testbed`, host `testbed`) with OPTIONS as `set_kvm`
    takes them."""
    provider: dict[str, Any] = yaml.safe_load(testbed.provider_yaml.read_text())
    return set_kvm(provider, **options)


def unreachable_kvm_provider(directory: Path, **host_keys: Any) -> dict[str, Any]:
    """A kvm provider `home` whose host (nas1, 192.0.2.1) is never contacted,
    its key files written to DIRECTORY: for configs that fail validation, run
    under mocks, or are previewed without touching a host. HOST_KEYS as
    `host` takes them."""
    return kvm_provider(*key_files(directory), hosts=[host(**host_keys)])


def external_provider(name: str = "corp") -> dict[str, Any]:
    return {"name": name, "type": "external"}


def gcp_provider(name: str = "gcp-eu") -> dict[str, Any]:
    """A gcp entry with one machine type (e2-small) and one image (debian)."""
    return {
        "name": name,
        "type": "gcp",
        "gcp": {
            "project": "crawl-proj-1",
            "region": "europe-west1",
            "machineTypes": ["e2-small"],
            "images": {"debian": "projects/debian-cloud/global/images/family/debian-12"},
        },
    }


def placement(
    machine_type: str | None = "s", image: str | None = "d", zone: str | None = None
) -> dict[str, Any]:
    return given(zone=zone, machineType=machine_type, image=image)


def proxy(
    name: str,
    provider: str,
    *,
    replicas: int | None = None,
    where: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    user_data: str | None = None,
    url: str | None = None,
    max_unavailable: int | str | None = None,
) -> dict[str, Any]:
    """A `proxies[]` entry: provisioned at WHERE (a `placement`), or, with
    URL, one that exists already."""
    return {"name": name, "provider": provider} | given(
        replicas=replicas,
        placement=where,
        labels=labels,
        userData=user_data,
        url=url,
        maxUnavailable=max_unavailable,
    )


def squid(
    *allowed_clients: str,
    port: int | None = None,
    username: str | None = None,
    connect_ports: Sequence[str] | None = None,
    blocked_destinations: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The `squid` block: ALLOWED_CLIENTS (10.0.0.0/8 if none), basic auth
    for USERNAME, and BLOCKED_DESTINATIONS in place of the default list
    (`[]` for a test page on a private address)."""
    return {"allowedClients": list(allowed_clients or ["10.0.0.0/8"])} | given(
        port=port,
        connectPorts=None if connect_ports is None else list(connect_ports),
        blockedDestinations=None if blocked_destinations is None else list(blocked_destinations),
        auth=None if username is None else {"username": username},
    )


def stack_config(
    providers: Sequence[dict[str, Any]],
    proxies: Sequence[dict[str, Any]],
    squid_block: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A whole config (keys without the namespace, as run_program and CliStack take it)."""
    return {
        "providers": list(providers),
        "proxies": list(proxies),
        "squid": squid_block if squid_block is not None else squid(),
    }


def stack_file(config: Mapping[str, Any]) -> dict[str, Any]:
    """CONFIG as a Pulumi.<stack>.yaml document: each key in the namespace."""
    return {"config": {f"{NAMESPACE}:{key}": value for key, value in config.items()}}


ALL_AT_ONCE = "100%"
"""`maxUnavailable` for a test fleet of several TCG guests that boot side by
side, as before replicas waited for one another (proxyinfra/rollout.py;
the waits are tested by tests/engine/test_cli_rollout.py): one boot instead
of one per replica."""
