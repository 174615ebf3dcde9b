"""Stack config validation: every error at once, with paths and values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from providers.gcp.config import GcpProviderEntry
from providers.kubernetes.config import KubernetesProvider, KubernetesProviderEntry
from providers.kvm.config import DEFAULT_VENDOR_DATA, KvmProviderEntry
from proxyinfra.clients import ClientRanges, client_ranges
from proxyinfra.config import StackConfig
from proxyinfra.validation import ConfigError, validate
from tests.support.stack_config import (
    external_provider,
    host,
    image,
    kvm_provider,
    machine_type,
    placement,
    proxy,
    stack_config,
)

ROOT = Path(__file__).resolve().parents[2]
CORP_URL = "http://u:p@10.0.0.5:3128"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    (tmp_path / "id_ed25519").write_text("key\n")
    (tmp_path / "known_hosts").write_text("hosts\n")
    return tmp_path


def good_config() -> dict[str, Any]:
    """Key files relative to the project directory (the `keys` fixture)."""
    hosts = [
        host("nas1", "192.0.2.10:22", bridge="br0"),
        host("nas2", "192.0.2.11:22", network="default"),
    ]
    kvm = kvm_provider(
        "id_ed25519",
        "known_hosts",
        name="kvm-home",
        hosts=hosts,
        images={"debian-13": image("https://images.example/debian-13.qcow2")},
        machine_types={"small": machine_type()},
    )
    home = proxy(
        "home",
        "kvm-home",
        replicas=2,
        where=placement("small", "debian-13", zone="nas1"),
        labels={"site": "home"},
    )
    return stack_config([kvm, external_provider()], [home, proxy("corp-1", "corp", url=CORP_URL)])


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
    assert (host.domain_type, host.cpu_mode) == ("kvm", "host-passthrough")
    assert (host.ssh_host, host.ssh_port, host.user) == ("192.0.2.10", 22, "virt")
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
        "domainType, name, network, pool, socket, user); did you mean 'address'?",
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
    raw["providers"][0]["kvm"]["hosts"].append(
        {"name": "nas1", "address": "a:22", "user": "u", "bridge": "b"}
    )
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


# --- gcp and kubernetes ----------------------------------------------------------

UBUNTU = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"


def cloud_config() -> dict[str, Any]:
    raw = good_config()
    raw["providers"] += [
        {
            "name": "gcp-eu",
            "type": "gcp",
            "gcp": {
                "project": "crawl-proj-1",
                "region": "europe-west1",
                "zones": ["europe-west1-b", "europe-west1-c"],
                "machineTypes": ["e2-small"],
                "images": {
                    "debian": "projects/debian-cloud/global/images/family/debian-12",
                    "ubuntu": {"image": UBUNTU},
                },
            },
        },
        {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress"}},
    ]
    raw["proxies"] += [
        proxy(
            "eu", "gcp-eu", replicas=2, where=placement("e2-small", "debian"), labels={"site": "eu"}
        ),
        proxy("pods", "cluster", labels={"site": "Cluster.A"}),
    ]
    return raw


def test_gcp_and_kubernetes_config_parses_with_defaults(keys: Path) -> None:
    config = validate(cloud_config(), keys)
    gcp = config.providers["gcp-eu"]
    assert isinstance(gcp, GcpProviderEntry)
    assert gcp.gcp.images["ubuntu"].bootstrap_method == "cloud-init"
    assert gcp.gcp.images["debian"].bootstrap_method == "startup-script"
    assert (gcp.gcp.network, gcp.gcp.boot_disk_size_gb, gcp.gcp.static_ip) == ("default", 10, False)
    assert gcp.gcp.provisioning is None  # GCP's own default, and no scheduling block
    k8s = config.providers["cluster"]
    assert isinstance(k8s, KubernetesProviderEntry)
    assert k8s.kubernetes.create_namespace is True
    assert k8s.kubernetes.service_type == "ClusterIP"
    assert "@sha256:" in k8s.kubernetes.image
    assert config.warnings == []
    names = [r.name for r in config.replicas()]
    assert names == ["home-0", "home-1", "corp-1", "eu-0", "eu-1", "pods-0"]


def test_gcp_provisioning_is_standard_or_spot(keys: Path) -> None:
    raw = cloud_config()
    raw["providers"][2]["gcp"]["provisioning"] = "spot"
    provider = validate(raw, keys).providers["gcp-eu"]
    assert isinstance(provider, GcpProviderEntry) and provider.gcp.provisioning == "spot"
    raw["providers"][2]["gcp"]["provisioning"] = "preemptible"
    assert errors_of(raw, keys) == [
        "providers[2].gcp.provisioning: Input should be 'standard' or 'spot' (got 'preemptible')"
    ]


def test_placement_errors_of_every_backend_in_one_list(keys: Path) -> None:
    raw = cloud_config()
    raw["proxies"][0]["placement"]["zone"] = "nas9"
    raw["proxies"][2]["placement"] = {
        "zone": "europe-west1-d",
        "region": "us-east1",
        "machineType": "n2-standard-64",
        "image": "centos",
    }
    raw["proxies"][3]["placement"] = {"machineType": "big", "image": "x", "region": "r"}
    assert errors_of(raw, keys) == [
        "proxies[0].placement.zone: unknown host 'nas9' (hosts: nas1, nas2)",
        "proxies[2].placement.region: provider 'gcp-eu' is in region 'europe-west1' (got 'us-east1')",
        "proxies[2].placement.zone: unknown zone 'europe-west1-d' (zones: europe-west1-b, "
        "europe-west1-c)",
        "proxies[2].placement.machineType: unknown machineType 'n2-standard-64' "
        "(machineTypes: e2-small)",
        "proxies[2].placement.image: unknown image 'centos' (images: debian, ubuntu; or "
        "projects/P/global/images/family/F)",
        "proxies[3].placement.machineType: not used by kubernetes proxies (got 'big')",
        "proxies[3].placement.image: not used by kubernetes proxies (got 'x')",
        "proxies[3].placement.region: not used by kubernetes proxies (got 'r')",
    ]


def test_gcp_zone_and_image_defaults(keys: Path) -> None:
    raw = cloud_config()
    gcp = raw["providers"][2]["gcp"]
    gcp["zones"] = ["europe-west1-b", "us-east1-b"]
    del raw["proxies"][2]["placement"]["image"]
    assert errors_of(raw, keys) == [
        "providers[2].gcp.zones[1]: zone 'us-east1-b' is not in region 'europe-west1'",
        "proxies[2].placement.image: required (images: debian, ubuntu; or "
        "projects/P/global/images/family/F)",
    ]
    del gcp["zones"], gcp["images"]  # the default: debian-12 only, so no image needed
    assert errors_of(raw, keys) == [
        "proxies[2].placement.zone: required when provider 'gcp-eu' lists no zones "
        "(or list gcp.zones to spread replicas over them)"
    ]
    raw["proxies"][2]["placement"]["zone"] = "europe-west4-a"
    assert errors_of(raw, keys) == [
        "proxies[2].placement.zone: zone 'europe-west4-a' is not in region 'europe-west1'"
    ]
    raw["proxies"][2]["placement"]["zone"] = "europe-west1-b"
    raw["proxies"][2]["placement"]["image"] = (
        "projects/rocky-linux-cloud/global/images/family/rocky-linux-9"
    )
    validate(raw, keys)


def test_gcp_provider_fields(keys: Path) -> None:
    raw = cloud_config()
    gcp = raw["providers"][2]["gcp"]
    gcp["project"] = "Crawl"
    gcp["images"]["bad"] = "debian-cloud/debian-12"
    gcp["bootDiskSizeGb"] = 5
    assert errors_of(raw, keys) == [
        "providers[2].gcp.project: must be a GCP project id: 6-30 lowercase letters, digits or "
        "'-', starting with a letter (got 'Crawl')",
        "providers[2].gcp.images.bad.image: must be an image path "
        "projects/P/global/images/family/F or projects/P/global/images/NAME "
        "(got 'debian-cloud/debian-12')",
        "providers[2].gcp.bootDiskSizeGb: Input should be greater than or equal to 10 (got 5)",
    ]


def test_broken_gcp_provider_still_checks_its_proxies_placement(keys: Path) -> None:
    raw = cloud_config()
    raw["providers"][2]["gcp"]["staticIP"] = True
    raw["proxies"][2]["placement"]["machineType"] = "e2-huge"
    assert errors_of(raw, keys) == [
        "providers[2].gcp.staticIP: unknown key (allowed: bootDiskSizeGb, images, machineTypes, "
        "network, project, provisioning, region, staticIp, subnetwork, zones); did you mean 'staticIp'?",
        "proxies[2].placement.machineType: unknown machineType 'e2-huge' (machineTypes: e2-small)",
    ]


def test_user_data_needs_a_cloud_init_image(keys: Path) -> None:
    raw = cloud_config()
    raw["proxies"][2]["userData"] = "#cloud-config\npackages: [curl]\n"
    assert errors_of(raw, keys) == [
        "proxies[2].userData: needs an image with cloud-init; image "
        "'projects/debian-cloud/global/images/family/debian-12' boots with a startup script "
        "(set bootstrap: cloud-init on the image if it has cloud-init)"
    ]
    raw["proxies"][2]["placement"]["image"] = "ubuntu"
    validate(raw, keys)
    raw["proxies"][2]["placement"]["image"] = "debian"
    raw["providers"][2]["gcp"]["images"]["debian"] = {
        "image": "projects/debian-cloud/global/images/family/debian-12",
        "bootstrap": "cloud-init",  # an own image built with cloud-init, say
    }
    validate(raw, keys)


def test_cloud_label_values_follow_the_clouds_rules(keys: Path) -> None:
    raw = cloud_config()
    raw["proxies"][2]["labels"] = {"site": "EU West", "egress-proxies-stack": "x"}
    raw["proxies"][3]["labels"] = {"site": "-edge-"}
    assert errors_of(raw, keys) == [
        "proxies[2].labels.site: GCP label values are lowercase letters, digits, '_' or '-', "
        "at most 63 (got 'EU West')",
        "proxies[2].labels.egress-proxies-stack: keys starting with 'egress-proxies' are the "
        "proxies' own GCP labels",
        "proxies[3].labels.site: Kubernetes label values are letters, digits, '-', '_' or '.', "
        "alphanumeric at both ends, at most 63 (got '-edge-')",
    ]


def test_kubernetes_provider_fields(keys: Path) -> None:
    raw = cloud_config()
    k8s = raw["providers"][3]["kubernetes"]
    k8s.update(
        serviceType="NodePort",
        cpuRequest="2",
        cpuLimit="500m",
        memoryLimit="lots",
        kubeconfig="kube/missing",
    )
    errors = errors_of(raw, keys)
    assert errors == [
        "providers[3].kubernetes.serviceType: Input should be 'ClusterIP' or 'LoadBalancer' "
        "(got 'NodePort')",
        "providers[3].kubernetes.memoryLimit: must be a Kubernetes quantity such as 500m, 1, "
        "64Mi or 1Gi (got 'lots')",
    ]
    del k8s["serviceType"], k8s["memoryLimit"]
    assert errors_of(raw, keys) == [
        f"providers[3].kubernetes.kubeconfig: file not found: {keys}/kube/missing",
        "providers[3].kubernetes.cpuRequest: '2' is above cpuLimit '500m'; Kubernetes refuses "
        "such a pod",
    ]
    (keys / "kube").mkdir()
    (keys / "kube" / "missing").write_text("apiVersion: v1\n")
    k8s.update(cpuRequest="250m", image="ubuntu/squid:latest")
    config = validate(raw, keys)
    assert config.warnings == [
        "providers[3].kubernetes.image 'ubuntu/squid:latest' is not pinned (no @sha256 digest): "
        "a tag can move, so pods may run an image nobody reviewed"
    ]


def test_kubernetes_manifest_address(keys: Path) -> None:
    raw = cloud_config()
    k8s = raw["providers"][3]["kubernetes"]
    assert config_entry(validate(raw, keys)).manifest_address == "serviceDNS"
    k8s["manifestAddress"] = "podIP"
    assert errors_of(raw, keys) == [
        "providers[3].kubernetes.manifestAddress: Input should be 'serviceDNS' or 'clusterIP' "
        "(got 'podIP')"
    ]
    k8s["manifestAddress"] = "clusterIP"
    assert config_entry(validate(raw, keys)).manifest_address == "clusterIP"
    k8s["serviceType"] = "LoadBalancer"
    assert errors_of(raw, keys) == [
        "providers[3].kubernetes.manifestAddress: 'clusterIP' is for ClusterIP Services; a "
        "LoadBalancer's proxies are listed by their load balancer address"
    ]


def config_entry(config: StackConfig) -> KubernetesProvider:
    entry = config.providers["cluster"]
    assert isinstance(entry, KubernetesProviderEntry)
    return entry.kubernetes


def test_clients_that_together_cover_everyone_are_refused(keys: Path) -> None:
    raw = cloud_config()
    raw["squid"] = {"allowedClients": ["0.0.0.0/1", "128.0.0.0/1"]}
    assert errors_of(raw, keys) == [
        "squid.allowedClients: together these admit every IPv4 address, which opens the proxies "
        "to the whole internet; set squid.allowOpenProxyToTheInternet: true if that is really "
        "meant"
    ]
    # squid sees IPv4 clients as IPv4-mapped IPv6, inside ::/1.
    raw["squid"] = {"allowedClients": ["::/1", "8000::/1"]}
    assert "every IPv4 and IPv6 address" in errors_of(raw, keys)[0]
    raw["squid"]["allowOpenProxyToTheInternet"] = True
    (warning,) = validate(raw, keys).warnings
    assert "GCP firewall" in warning and "without squid.auth" in warning


def test_client_ranges_split_families_the_way_squid_sees_them() -> None:
    ranges = client_ranges(["10.0.0.0/8", "::ffff:10.1.0.0/112", "2001:db8::/32", "192.0.2.0/24"])
    assert ranges == ClientRanges(v4=["10.0.0.0/8", "192.0.2.0/24"], v6=["2001:db8::/32"])
    assert ranges.everyone == []
    assert client_ranges(["::/1"]).v4 == ["0.0.0.0/0"]  # ::/1 holds every IPv4 client
    assert client_ranges(["::/1"]).everyone == ["IPv4"]


def doc_block(path: Path, heading: str) -> dict[str, Any]:
    """The first yaml block below HEADING in a Markdown file, parsed."""
    text = path.read_text()
    section = text[text.index(f"\n## {heading}\n") :]
    block = section[
        section.index("```yaml\n") + 8 : section.index("\n```", section.index("```yaml"))
    ]
    parsed = yaml.safe_load(block)
    assert isinstance(parsed, dict), block
    return parsed


def test_the_seed_sample_provider_entry_validates_as_written(tmp_path: Path) -> None:
    """docs/kvm-provider.md, "Add a provider entry": the seed's field names
    (vcpus, memoryMiB, address host:port, user) with its files in place."""
    config = doc_block(ROOT / "docs" / "kvm-provider.md", "Add a provider entry")["config"]
    raw = {key.removeprefix("egress-proxies:"): value for key, value in config.items()}
    kvm = raw["providers"][0]["kvm"]
    home = tmp_path / "home"
    for key in ("sshKeyFile", "knownHostsFile"):
        target = home / kvm[key].removeprefix("~/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        parsed = validate(raw, tmp_path)
    entry = parsed.providers["kvm-home"]
    assert isinstance(entry, KvmProviderEntry)
    small = entry.kvm.machine_types["small"]
    assert (small.vcpus, small.memory_mib) == (1, 1024)
    nas1 = entry.kvm.hosts[0]
    assert (nas1.ssh_host, nas1.ssh_port, nas1.user) == ("nas1.home.lan", 22, "virt")
    assert [r.name for r in parsed.replicas()] == ["home-0", "home-1"]


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        ("nas1.home.lan:22", "nas1.home.lan", 22),
        ("192.0.2.10:2222", "192.0.2.10", 2222),
        ("[2001:db8::1]:22", "2001:db8::1", 22),
    ],
)
def test_host_address_is_host_and_port(keys: Path, address: str, host: str, port: int) -> None:
    raw = good_config()
    raw["providers"][0]["kvm"]["hosts"][0]["address"] = address
    parsed = validate(raw, keys).providers["kvm-home"]
    assert isinstance(parsed, KvmProviderEntry)
    assert (parsed.kvm.hosts[0].ssh_host, parsed.kvm.hosts[0].ssh_port) == (host, port)


@pytest.mark.parametrize(
    "address", ["192.0.2.10", "nas1:", ":22", "nas1:0", "nas1:65536", "nas1:ssh", "2001:db8::1:22"]
)
def test_host_address_without_a_usable_port_is_an_error(keys: Path, address: str) -> None:
    raw = good_config()
    raw["providers"][0]["kvm"]["hosts"][0]["address"] = address
    assert errors_of(raw, keys) == [
        "providers[0].kvm.hosts[0].address: must be host:port, such as nas1.home.lan:22 or "
        f"[2001:db8::1]:22 (SSH port 1-65535) (got {address!r})"
    ]


def test_old_field_names_are_errors_that_name_the_seed_ones(keys: Path) -> None:
    raw = good_config()
    raw["providers"][0]["kvm"]["machineTypes"] = {"small": {"cpus": 1, "memoryMb": 512}}
    del raw["providers"][0]["kvm"]["hosts"][0]["user"]
    raw["providers"][0]["kvm"]["hosts"][1]["port"] = 22
    assert errors_of(raw, keys) == [
        "providers[0].kvm.machineTypes.small.vcpus: required",
        "providers[0].kvm.machineTypes.small.memoryMiB: required",
        "providers[0].kvm.machineTypes.small.cpus: unknown key (allowed: memoryMiB, vcpus); "
        "did you mean 'vcpus'?",
        "providers[0].kvm.machineTypes.small.memoryMb: unknown key (allowed: memoryMiB, vcpus); "
        "did you mean 'memoryMiB'?",
        "providers[0].kvm.hosts[0].user: required",
        "providers[0].kvm.hosts[1].port: unknown key (allowed: address, bridge, cpuMode, "
        "domainType, name, network, pool, socket, user)",
    ]


@pytest.mark.parametrize(
    ("host", "error"),
    [
        (
            {"cpuMode": "custom"},
            "providers[0].kvm.hosts[0].cpuMode: 'custom' is not a CPU model; name the model itself",
        ),
        (
            {"cpuMode": "host passthrough"},
            "providers[0].kvm.hosts[0].cpuMode: 'host passthrough' is not one of "
            "host-passthrough, host-model, maximum or a CPU model name (e.g. Skylake-Client-v4)",
        ),
        (
            {"bridge": "a-very-long-bridge0"},
            "providers[0].kvm.hosts[0].bridge: 'a-very-long-bridge0' is not a Linux interface "
            "name (1-15 characters, no '/', ':' or spaces)",
        ),
        (
            {"bridge": "br:0"},
            "providers[0].kvm.hosts[0].bridge: 'br:0' is not a Linux interface name "
            "(1-15 characters, no '/', ':' or spaces)",
        ),
        (
            {"bridge": None, "network": "lan/1"},
            "providers[0].kvm.hosts[0].network: 'lan/1' contains '/'",
        ),
        (
            {"bridge": None, "network": "lan\t1"},
            "providers[0].kvm.hosts[0].network: 'lan\\t1' contains the control character '\\t'",
        ),
    ],
)
def test_libvirt_rules_on_host_fields_fail_validation(
    keys: Path, host: dict[str, Any], error: str
) -> None:
    """What the domain XML builder would refuse during `up` (after the base,
    overlay and seed were made) is a config error before any resource."""
    raw = good_config()
    entry = raw["providers"][0]["kvm"]["hosts"][0]
    entry.update(host)
    if entry.get("bridge") is None:
        entry.pop("bridge", None)
    assert errors_of(raw, keys) == [error]


def test_every_cpu_mode_and_model_the_builder_takes_passes(keys: Path) -> None:
    from providers.kvm.rules import CPU_MODES

    for mode in (*CPU_MODES, "Skylake-Client-v4", "qemu64"):
        raw = good_config()
        raw["providers"][0]["kvm"]["hosts"][0]["cpuMode"] = mode
        validate(raw, keys)
