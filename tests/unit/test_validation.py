"""Stack config validation: every error at once, with paths and values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxyinfra.config import DEFAULT_VENDOR_DATA, KvmProviderEntry
from proxyinfra.validation import ConfigError, validate


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    (tmp_path / "id_ed25519").write_text("key\n")
    (tmp_path / "known_hosts").write_text("hosts\n")
    return tmp_path


def kvm_provider(**overrides: Any) -> dict[str, Any]:
    kvm: dict[str, Any] = {
        "sshKeyFile": "id_ed25519",
        "knownHostsFile": "known_hosts",
        "images": {"debian-13": {"url": "https://images.example/debian-13.qcow2"}},
        "machineTypes": {"small": {"cpus": 1, "memoryMb": 512}},
        "hosts": [
            {"name": "nas1", "address": "192.0.2.10", "bridge": "br0"},
            {"name": "nas2", "address": "192.0.2.11", "network": "default"},
        ],
    }
    kvm.update(overrides)
    return {"name": "kvm-home", "type": "kvm", "kvm": kvm}


def good_config() -> dict[str, Any]:
    return {
        "providers": [kvm_provider(), {"name": "corp", "type": "external"}],
        "proxies": [
            {
                "name": "home",
                "provider": "kvm-home",
                "replicas": 2,
                "placement": {"zone": "nas1", "machineType": "small", "image": "debian-13"},
                "labels": {"site": "home"},
            },
            {"name": "corp-1", "provider": "corp", "url": "http://u:p@10.0.0.5:3128"},
        ],
        "squid": {"allowedClients": ["10.0.0.0/8"]},
    }


def errors_of(raw: dict[str, Any], base: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(raw, base)
    return [str(issue) for issue in info.value.issues]


def test_good_config_parses_with_seed_defaults(keys: Path) -> None:
    config = validate(good_config(), keys)
    kvm = config.providers["kvm-home"]
    assert isinstance(kvm, KvmProviderEntry)
    assert kvm.kvm.insecure_ignore_host_key is False
    assert kvm.kvm.disk_size_gb == 10
    assert kvm.kvm.vendor_data == DEFAULT_VENDOR_DATA
    assert "qemu-guest-agent" in kvm.kvm.vendor_data
    image = kvm.kvm.images["debian-13"]
    assert (image.format, image.firmware) == ("qcow2", "uefi")
    host = kvm.kvm.hosts[0]
    assert host.socket == "/var/run/libvirt/libvirt-sock"
    assert host.pool == "default"
    assert (host.domain_type, host.cpu_mode, host.port) == ("kvm", "host-passthrough", 22)
    assert config.squid.port == 3128
    assert [r.name for r in config.replicas()] == ["home-0", "home-1", "corp-1"]


def test_five_mistakes_reported_together_with_paths(keys: Path) -> None:
    raw = good_config()
    raw["providers"][0]["kvm"]["diskSizeGb"] = "ten"  # 1: wrong type
    raw["providers"][0]["kvm"]["hosts"][0]["adress"] = "x"  # 2: unknown key (typo)
    raw["proxies"][0]["placement"]["zone"] = "nas9"  # 3: unknown host
    raw["proxies"][0]["placement"]["machineType"] = "huge"  # 4: unknown machine type
    raw["proxies"].append({"name": "lost", "provider": "nowhere"})  # 5: unknown provider
    errors = errors_of(raw, keys)
    assert errors == [
        "providers[0].kvm.diskSizeGb: Input should be a valid integer, unable to parse string "
        "as an integer (got 'ten')",
        "providers[0].kvm.hosts[0].adress: unknown key (allowed: address, bridge, cpuMode, "
        "domainType, name, network, pool, port, socket, user); did you mean 'address'?",
        "proxies[0].placement.zone: unknown host 'nas9' (hosts: nas1, nas2)",
        "proxies[0].placement.machineType: unknown machineType 'huge' (machineTypes: small)",
        "proxies[2].provider: unknown provider 'nowhere' (providers: corp)",
    ]
    # One message lists them all (that is what `pulumi preview` prints).
    with pytest.raises(ConfigError) as info:
        validate(raw, keys)
    assert str(info.value).startswith("invalid stack config (5 errors):\n")
    assert all(e in str(info.value) for e in errors)


def test_placement_rules(keys: Path) -> None:
    raw = good_config()
    placement = raw["proxies"][0]["placement"]
    del placement["zone"]
    placement["image"] = "ftp://elsewhere/img"
    del placement["machineType"]
    placement["region"] = "ignored-for-kvm"
    assert errors_of(raw, keys) == [
        "proxies[0].placement.zone: required when provider 'kvm-home' has several hosts "
        "(hosts: nas1, nas2)",
        "proxies[0].placement.machineType: required (machineTypes: small)",
        "proxies[0].placement.image: unknown image 'ftp://elsewhere/img' (images: debian-13; "
        "or an http(s) URL)",
    ]


def test_zone_may_be_omitted_with_one_host_and_image_may_be_url(keys: Path) -> None:
    raw = good_config()
    raw["providers"][0]["kvm"]["hosts"] = raw["providers"][0]["kvm"]["hosts"][:1]
    raw["proxies"][0]["placement"] = {"machineType": "small", "image": "http://h/x.qcow2"}
    config = validate(raw, keys)
    assert config.replicas()[0].entry.placement.zone is None


def test_key_files_named_relative_to_project_and_home_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    raw = good_config()
    raw["providers"][0]["kvm"]["sshKeyFile"] = "keys/missing"
    raw["providers"][0]["kvm"]["knownHostsFile"] = "~/.ssh/known_hosts"
    assert errors_of(raw, tmp_path) == [
        f"providers[0].kvm.sshKeyFile: file not found: {tmp_path}/keys/missing",
        f"providers[0].kvm.knownHostsFile: file not found: {tmp_path}/home/.ssh/known_hosts",
    ]


def test_known_hosts_required_unless_insecure_which_warns(keys: Path) -> None:
    raw = good_config()
    del raw["providers"][0]["kvm"]["knownHostsFile"]
    assert errors_of(raw, keys) == [
        "providers[0].kvm.knownHostsFile: required (or set insecureIgnoreHostKey: true, "
        "which accepts any host key)"
    ]
    raw["providers"][0]["kvm"]["insecureIgnoreHostKey"] = True
    config = validate(raw, keys)
    assert len(config.warnings) == 1
    assert "not verified" in config.warnings[0] and "impersonate" in config.warnings[0]


def test_unknown_keys_everywhere(keys: Path) -> None:
    raw = good_config()
    raw["proxies"][0]["replica"] = 3
    raw["squid"]["ports"] = 1
    raw["egress"] = {}
    errors = errors_of(raw, keys)
    assert errors[0].startswith("egress-proxies:egress: unknown key (allowed: providers, proxies")
    assert "proxies[0].replica: unknown key" in errors[1]
    assert "did you mean 'replicas'?" in errors[1]
    assert errors[2].startswith("squid.ports: unknown key (allowed: allowOpenProxyToTheInternet")


def test_external_proxy_rules_never_echo_the_url(keys: Path) -> None:
    raw = good_config()
    raw["proxies"][1].update(url="socks5://user:s3cret@h:1", replicas=2, placement={"zone": "x"})
    errors = errors_of(raw, keys)
    assert errors == [
        "proxies[1].replicas: not allowed for an external proxy: one entry per URL",
        "proxies[1].placement: not allowed for an external proxy",
        "proxies[1].url: must be http://[user:pass@]host:port (got scheme 'socks5', host 'h', "
        "port 1)",
    ]
    assert not any("s3cret" in e for e in errors)


def test_provider_types_and_bridge_or_network(keys: Path) -> None:
    raw = good_config()
    raw["providers"].append({"name": "odd", "type": "vmware"})
    raw["providers"][0]["kvm"]["hosts"][1]["bridge"] = "br0"
    raw["providers"][0]["kvm"]["hosts"].append({"name": "nas1", "address": "a", "bridge": "b"})
    assert errors_of(raw, keys) == [
        "providers[2].type: unknown provider type 'vmware' (types: external, gcp, kubernetes, kvm)",
        "providers[0].kvm.hosts[1]: set exactly one of bridge or network (both set)",
        "providers[0].kvm.hosts[2].name: duplicate host name 'nas1'",
    ]


def test_replica_names_must_not_collide(keys: Path) -> None:
    raw = good_config()
    raw["proxies"].append(
        {
            "name": "home-1",
            "provider": "corp",
            "url": "http://10.0.0.6:3128",
        }
    )
    assert errors_of(raw, keys) == [
        "proxies[2].name: proxy name 'home-1' also made by proxies[0]",
    ]


def test_squid_rules(keys: Path) -> None:
    raw = good_config()
    raw["squid"] = {"allowedClients": ["0.0.0.0/0", "10.0.0.1/8"], "connectPorts": ["443", "9-3"]}
    errors = errors_of(raw, keys)
    assert errors == [
        "squid.allowedClients[1]: not a CIDR network (address/prefix, no host bits set) (got '10.0.0.1/8')",
        "squid.connectPorts[1]: not a port or port range within 1-65535 (got '9-3')",
    ]
    raw["squid"] = {"allowedClients": ["0.0.0.0/0"]}
    assert errors_of(raw, keys) == [
        "squid.allowedClients[0]: '0.0.0.0/0' opens the proxies to the whole internet; set "
        "squid.allowOpenProxyToTheInternet: true if that is really meant"
    ]
    raw["squid"]["allowOpenProxyToTheInternet"] = True
    assert validate(raw, keys).squid.allowed_clients == ["0.0.0.0/0"]
    raw["squid"] = {}
    assert errors_of(raw, keys) == [
        "squid.allowedClients: required: the CIDRs of the crawlers that may use the proxies"
    ]


def test_user_data_must_be_cloud_config_mapping(keys: Path) -> None:
    raw = good_config()
    raw["proxies"][0]["userData"] = "#!/bin/sh\necho hi"
    assert errors_of(raw, keys) == [
        "proxies[0].userData: must be a cloud-config document starting with '#cloud-config'"
    ]
    raw["proxies"][0]["userData"] = "#cloud-config\n- a\n- b\n"
    assert errors_of(raw, keys) == ["proxies[0].userData: must be a YAML mapping (got list)"]
    raw["proxies"][0]["userData"] = "#cloud-config\npackages: [curl]\n"
    assert validate(raw, keys).proxies[0].user_data is not None
