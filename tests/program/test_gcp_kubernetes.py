"""The stack program under mocks with kvm, gcp, kubernetes and external proxies:
what the gcp and kubernetes backends register, and the manifest.

The clouds are mocked by tests/support/mock_clouds.py (external IPs, LoadBalancer
ingress, credentials with a real bcrypt hash).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import bcrypt
import jsonschema
import pytest
import yaml

from providers.gcp.bootstrap import BOOTSTRAP_KEYS, render_user_data
from providers.gcp.labels import network_tag
from providers.gcp.squid_sync import squid_metadata
from providers.gcp.startup import render_startup_script
from providers.kubernetes.container import SQUID_ARGS, container_settings
from proxyinfra.config import Squid
from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.manifest import load_schema
from proxyinfra.names import proxy_id
from proxyinfra.squid import password_file_line, render_squid_conf, settings_from_config
from tests.harness.program import ProgramResult, RegisteredResource, run_program
from tests.support.mock_clouds import ADDRESS, DEBIAN, DYNAMIC, HOOK, INSTANCE, SERVICE, UBUNTU
from tests.support.stack_config import (
    external_provider,
    placement,
    proxy,
    squid,
    stack_config,
    unreachable_kvm_provider,
)

PROGRAM = "proxyinfra.program:main"
FIREWALL = "gcp:compute/firewall:Firewall"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
SECRET = "kubernetes:core/v1:Secret"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
NAMESPACE = "kubernetes:core/v1:Namespace"
OWN_USER_DATA = "#cloud-config\npackages: [curl]\n"


# --- the fleet -----------------------------------------------------------------

SQUID = squid(
    "10.8.0.0/16",
    "192.0.2.0/24",
    "2001:db8::/32",
    "::ffff:10.10.0.0/112",
    port=3129,
    username="crawler",
)


def fleet_config(directory: Path) -> dict[str, Any]:
    providers = [
        unreachable_kvm_provider(directory),
        {
            "name": "gcp-eu",
            "type": "gcp",
            "gcp": {
                "project": "crawl-proj-1",
                "region": "europe-west1",
                "zones": ["europe-west1-b", "europe-west1-c"],
                "network": "crawl-vpc",
                "subnetwork": "proxies-eu",
                "machineTypes": ["e2-small"],
                "images": {"debian": DEBIAN, "ubuntu": {"image": UBUNTU}},
                "bootDiskSizeGb": 20,
                "staticIp": True,
            },
        },
        {
            "name": "gcp-us",
            "type": "gcp",
            "gcp": {"project": "crawl-proj-2", "region": "us-central1"},
        },
        {
            "name": "cluster",
            "type": "kubernetes",
            "kubernetes": {
                "namespace": "egress",
                "clientNamespaces": ["crawlers"],
                "cpuLimit": "1",
                "memoryLimit": "128Mi",
            },
        },
        {
            "name": "edge",
            "type": "kubernetes",
            "kubernetes": {
                "namespace": "edge-proxies",
                "createNamespace": False,
                "serviceType": "LoadBalancer",
                "context": "edge-ctx",
            },
        },
        external_provider(),
    ]
    proxies = [
        proxy("home", "home", where=placement()),
        proxy(
            "eu", "gcp-eu", replicas=3, where=placement("e2-small", "debian"), labels={"site": "eu"}
        ),
        proxy(
            "eu-ubuntu",
            "gcp-eu",
            where=placement("e2-small", "ubuntu", zone="europe-west1-c"),
            user_data=OWN_USER_DATA,
        ),
        proxy("us", "gcp-us", where=placement("e2-micro", None, zone="us-central1-a")),
        proxy(
            "pods",
            "cluster",
            replicas=2,
            where=placement(None, None, zone="europe-west1-b"),
            labels={"site": "cluster"},
        ),
        proxy("edge", "edge"),
        proxy("corp-1", "corp", url="http://10.0.0.5:3128"),
    ]
    return stack_config(providers, proxies, SQUID)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> ProgramResult:
    config = fleet_config(tmp_path_factory.mktemp("keys"))
    return run_program(PROGRAM, config, new_resource_hook=HOOK).raise_for_error()


def pid(name: str) -> str:
    return proxy_id("egress-proxies", "dev", name)


def by_name(result: ProgramResult, type_: str) -> dict[str, RegisteredResource]:
    return {r.name: r for r in result.resources_of_type(type_)}


def passwords(result: ProgramResult) -> dict[str, tuple[str, str]]:
    """Replica name -> (password, hash) of its generated credentials."""
    return {
        r.name.removesuffix("-credentials"): (r.outputs["password"], r.outputs["password_hash"])
        for r in result.resources_of_type(DYNAMIC)
        if r.name.endswith("-credentials")
    }


# --- the manifest ----------------------------------------------------------------


def test_manifest_lists_every_proxy_with_the_address_crawlers_use(fleet: ProgramResult) -> None:
    manifest = fleet.output("fleet")
    jsonschema.validate(manifest, load_schema())
    assert fleet.is_secret("fleet")
    entries = {p["name"]: p for p in manifest["proxies"]}
    assert list(entries) == [
        "home-0",
        "eu-0",
        "eu-1",
        "eu-2",
        "eu-ubuntu-0",
        "us-0",
        "pods-0",
        "pods-1",
        "edge-0",
        "corp-1",
    ]
    addresses = by_name(fleet, ADDRESS)
    instances = by_name(fleet, INSTANCE)
    # Static IPs: the reserved address; ephemeral: the instance's NAT IP.
    for name in ("eu-0", "eu-1", "eu-2", "eu-ubuntu-0"):
        assert entries[name]["host"] == addresses[f"{name}-address"].outputs["address"]
    nat = instances["us-0-instance"].outputs["networkInterfaces"][0]["accessConfigs"][0]["natIp"]
    assert entries["us-0"]["host"] == nat and nat.startswith("198.51.100.")
    assert [entries[f"eu-{i}"]["zone"] for i in range(3)] == [
        "europe-west1-b",
        "europe-west1-c",
        "europe-west1-b",
    ]
    assert entries["eu-ubuntu-0"]["zone"] == "europe-west1-c"
    assert entries["us-0"]["zone"] == "us-central1-a"
    # ClusterIP: the Service's DNS name; LoadBalancer: its ingress address.
    assert entries["pods-0"]["host"] == f"{pid('pods-0')}.egress.svc.cluster.local"
    assert entries["pods-0"]["zone"] == "europe-west1-b"
    lb = by_name(fleet, SERVICE)["edge-0-service"].outputs["status"]["loadBalancer"]
    assert entries["edge-0"]["host"] == lb["ingress"][0]["ip"]
    assert entries["home-0"]["host"].startswith("192.168.1.")
    assert entries["corp-1"]["host"] == "10.0.0.5" and "auth" not in entries["corp-1"]
    creds = passwords(fleet)
    for name, entry in entries.items():
        if name != "corp-1":
            assert entry["port"] == 3129 and entry["id"] == pid(name)
            assert entry["auth"] == {"username": "crawler", "password": creds[name][0]}
    assert entries["eu-1"]["labels"] == {"site": "eu"}


def test_no_password_or_hash_in_any_input_that_is_not_secret(fleet: ProgramResult) -> None:
    creds = passwords(fleet)
    assert len(creds) == 9  # every provisioned proxy, not the external one
    needles = [s for pair in creds.values() for s in pair]
    checked = 0
    for resource in fleet.resources:
        for key, value in resource.inputs.items():
            if key in resource.secret_inputs:
                continue
            text = json.dumps(value)
            assert not [n for n in needles if n in text], f"{resource.name}.{key}"
            checked += 1
    assert checked > 100


# --- gcp -----------------------------------------------------------------------


def test_firewall_opens_only_the_proxy_port_to_allowed_clients(fleet: ProgramResult) -> None:
    rules = by_name(fleet, FIREWALL)
    assert sorted(rules) == [
        "gcp-eu-proxy-port-ipv4",
        "gcp-eu-proxy-port-ipv6",
        "gcp-us-proxy-port-ipv4",
        "gcp-us-proxy-port-ipv6",
    ]
    tag = network_tag("egress-proxies", "dev", "gcp-eu")
    v4, v6 = rules["gcp-eu-proxy-port-ipv4"].inputs, rules["gcp-eu-proxy-port-ipv6"].inputs
    # GCP cannot mix families in one rule; the IPv4-mapped range is IPv4 here.
    assert v4["sourceRanges"] == ["10.8.0.0/16", "10.10.0.0/16", "192.0.2.0/24"]
    assert v6["sourceRanges"] == ["2001:db8::/32"]
    for rule, family in ((v4, "ipv4"), (v6, "ipv6")):
        assert rule["allows"] == [{"protocol": "tcp", "ports": ["3129"]}]
        assert rule["direction"] == "INGRESS" and rule["network"] == "crawl-vpc"
        assert rule["targetTags"] == [tag] and rule["name"] == f"{tag}-{family}"
        assert "sourceTags" not in rule and "denies" not in rule
    us_tag = network_tag("egress-proxies", "dev", "gcp-us")
    assert rules["gcp-us-proxy-port-ipv4"].inputs["network"] == "default"
    assert rules["gcp-us-proxy-port-ipv4"].inputs["targetTags"] == [us_tag]
    for name in ("eu-0", "eu-ubuntu-0"):
        assert by_name(fleet, INSTANCE)[f"{name}-instance"].inputs["tags"] == [tag]
    assert by_name(fleet, INSTANCE)["us-0-instance"].inputs["tags"] == [us_tag]


def test_instances_placement_disk_network_labels(fleet: ProgramResult) -> None:
    instances = by_name(fleet, INSTANCE)
    eu = instances["eu-1-instance"].inputs
    assert eu["name"] == pid("eu-1")
    assert (eu["zone"], eu["machineType"]) == ("europe-west1-c", "e2-small")
    assert eu["bootDisk"]["initializeParams"]["image"] == DEBIAN
    assert eu["bootDisk"]["initializeParams"]["size"] == 20
    assert eu["labels"] == {
        "site": "eu",
        "egress-proxies-project": "egress-proxies",
        "egress-proxies-stack": "dev",
        "egress-proxies-name": "eu-1",
    }
    nic = eu["networkInterfaces"][0]
    assert (nic["network"], nic["subnetwork"]) == ("crawl-vpc", "proxies-eu")
    address = by_name(fleet, ADDRESS)["eu-1-address"]
    assert nic["accessConfigs"] == [{"natIp": address.outputs["address"]}]
    assert address.inputs["name"] == pid("eu-1") and address.inputs["region"] == "europe-west1"
    assert address.inputs["addressType"] == "EXTERNAL"
    assert address.inputs["labels"]["egress-proxies-name"] == "eu-1"
    assert not any("serviceAccount" in i.inputs for i in instances.values())
    us = instances["us-0-instance"].inputs
    assert us["bootDisk"]["initializeParams"] == {
        "image": DEBIAN,  # the provider's only image, as placement names none
        "size": 10,
        "labels": us["labels"],
    }
    assert us["networkInterfaces"] == [{"network": "default", "accessConfigs": [{}]}]
    assert "us-0-address" not in by_name(fleet, ADDRESS)
    # Each gcp provider entry is its own explicit provider (project, region).
    providers = {r.name: r.inputs for r in fleet.resources_of_type("pulumi:providers:gcp")}
    assert providers["gcp-eu"]["project"] == "crawl-proj-1"
    assert providers["gcp-us"]["region"] == "us-central1"


def test_boot_metadata_is_secret_and_from_the_shared_renderers(fleet: ProgramResult) -> None:
    instances = by_name(fleet, INSTANCE)
    creds = passwords(fleet)
    squid_conf = render_squid_conf(settings_from_config(Squid.model_validate(SQUID)))
    for instance in instances.values():
        assert "metadata" in instance.secret_inputs
    shared = {"enable-oslogin": "TRUE", "enable-guest-attributes": "TRUE"}
    # Debian's images have no cloud-init: a startup script, the same for every proxy.
    debian = instances["eu-0-instance"].inputs["metadata"]
    line = password_file_line("crawler", creds["eu-0"][1])
    assert debian == {
        **shared,
        "startup-script": render_startup_script(),
        **squid_metadata(squid_conf, line),
    }
    # Ubuntu's have: user-data, with the user's own cloud-config merged.
    ubuntu = instances["eu-ubuntu-0-instance"].inputs["metadata"]
    line = password_file_line("crawler", creds["eu-ubuntu-0"][1])
    expected = render_user_data(OWN_USER_DATA, hostname=pid("eu-ubuntu-0"))
    assert ubuntu == {**shared, "user-data": expected, **squid_metadata(squid_conf, line)}
    assert "curl" in yaml.safe_load(expected)["packages"]


def test_only_the_boot_data_replaces_an_instance(fleet: ProgramResult) -> None:
    """squid's keys change in place (the agent on the VM applies them), so the
    replacement is asked for on the boot data's keys alone; the name is fixed,
    so the old VM goes first."""
    instances = by_name(fleet, INSTANCE)
    keys = [f'metadata["{key}"]' for key in BOOTSTRAP_KEYS]
    assert keys == ['metadata["user-data"]', 'metadata["startup-script"]']
    for instance in instances.values():
        assert (instance.replace_on_changes, instance.delete_before_replace) == (keys, True)
    # The boot data holds nothing of a proxy's own: two proxies, one script.
    scripts = {i.inputs["metadata"].get("startup-script") for i in instances.values()}
    assert scripts == {None, render_startup_script()}


# --- kubernetes ------------------------------------------------------------------


def test_config_map_carries_the_shared_squid_conf(fleet: ProgramResult) -> None:
    expected = render_squid_conf(container_settings(Squid.model_validate(SQUID)))
    maps = by_name(fleet, CONFIG_MAP)
    assert sorted(maps) == ["edge-0-squid-conf", "pods-0-squid-conf", "pods-1-squid-conf"]
    for name, config_map in maps.items():
        assert config_map.inputs["data"] == {"squid.conf": expected}
        assert config_map.inputs["metadata"]["name"] == pid(name.removesuffix("-squid-conf"))
    assert "max_filedescriptors 1024\ncache_mem 16 MB\n" in expected
    assert (
        "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid-egress-auth/passwords"
        in expected
    )
    assert maps["pods-0-squid-conf"].inputs["metadata"]["namespace"] == "egress"
    assert maps["edge-0-squid-conf"].inputs["metadata"]["namespace"] == "edge-proxies"


def test_secret_holds_the_hash_never_the_password(fleet: ProgramResult) -> None:
    creds = passwords(fleet)
    secrets = by_name(fleet, SECRET)
    assert sorted(secrets) == ["edge-0-auth", "pods-0-auth", "pods-1-auth"]
    for name, secret in secrets.items():
        replica = name.removesuffix("-auth")
        password, digest = creds[replica]
        assert "stringData" in secret.secret_inputs
        content = secret.inputs["stringData"]["passwords"]
        assert content == f"crawler:{digest}\n" and password not in content
        assert bcrypt.checkpw(password.encode(), digest.encode())
        assert secret.inputs["metadata"]["name"] == f"{pid(replica)}-auth"
        assert secret.inputs["type"] == "Opaque"


def test_deployment_probes_limits_security_and_mounts(fleet: ProgramResult) -> None:
    deployments = by_name(fleet, DEPLOYMENT)
    assert sorted(deployments) == ["edge-0-deployment", "pods-0-deployment", "pods-1-deployment"]
    spec = deployments["pods-1-deployment"].inputs["spec"]
    assert spec["replicas"] == 1
    selector = {
        "app.kubernetes.io/part-of": "egress-proxies",
        "app.kubernetes.io/instance": pid("pods-1"),
    }
    assert spec["selector"] == {"matchLabels": selector}
    labels = spec["template"]["metadata"]["labels"]
    assert (
        labels.items()
        >= {
            **selector,
            "site": "cluster",
            "egress-proxies/project": "egress-proxies",
            "egress-proxies/stack": "dev",
            "egress-proxies/name": "pods-1",
        }.items()
    )
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("ubuntu/squid:") and "@sha256:" in container["image"]
    assert container["args"] == SQUID_ARGS
    assert container["ports"] == [{"name": "proxy", "containerPort": 3129, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "proxy"}
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "128Mi"},
    }
    # The restricted Pod Security Standard, setting by setting (docs/kubernetes-provider.md).
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 13,
        "runAsGroup": 13,
        "fsGroup": 13,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"topology.kubernetes.io/zone": "europe-west1-b"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "config": "/etc/squid-egress",
        "auth": "/etc/squid-egress-auth",
        "run": "/run/squid",
        "spool": "/var/spool/squid",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == pid("pods-1")
    assert volumes["auth"]["secret"]["secretName"] == f"{pid('pods-1')}-auth"
    # The password hashes readable by squid's group only; the config by all.
    assert volumes["auth"]["secret"]["defaultMode"] == 0o440
    assert volumes["config"]["configMap"]["defaultMode"] == 0o444
    conf = by_name(fleet, CONFIG_MAP)["pods-1-squid-conf"].inputs["data"]["squid.conf"]
    digest = hashlib.sha256(conf.encode()).hexdigest()
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations == {"egress-proxies/squid-conf-sha256": digest}


def test_pods_of_the_stack_repel_each_other_across_nodes(fleet: ProgramResult) -> None:
    # Pods on different nodes egress from different addresses: each pod prefers
    # a node without another proxy of this stack (any proxy, any provider).
    stack = {"app.kubernetes.io/part-of": "egress-proxies", "egress-proxies/stack": "dev"}
    term = {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": stack},
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    deployments = by_name(fleet, DEPLOYMENT)
    for name, deployment in deployments.items():
        pod = deployment.inputs["spec"]["template"]
        assert pod["spec"]["affinity"] == {
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}
        }, name
        assert pod["metadata"]["labels"].items() >= stack.items(), name


def test_services_and_network_policies(fleet: ProgramResult) -> None:
    services = by_name(fleet, SERVICE)
    cluster_ip = services["pods-0-service"].inputs["spec"]
    assert cluster_ip["type"] == "ClusterIP"
    assert cluster_ip["ports"] == [
        {"name": "proxy", "port": 3129, "targetPort": "proxy", "protocol": "TCP"}
    ]
    assert "loadBalancerSourceRanges" not in cluster_ip
    lb = services["edge-0-service"].inputs["spec"]
    assert lb["type"] == "LoadBalancer" and lb["externalTrafficPolicy"] == "Local"
    clients = ["10.8.0.0/16", "10.10.0.0/16", "192.0.2.0/24", "2001:db8::/32"]
    assert lb["loadBalancerSourceRanges"] == clients
    policies = by_name(fleet, NETWORK_POLICY)
    pods = policies["pods-0-network-policy"].inputs["spec"]
    assert pods["policyTypes"] == ["Ingress"]
    assert pods["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == pid("pods-0")
    (rule,) = pods["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 3129}]
    assert rule["from"] == [{"ipBlock": {"cidr": c}} for c in clients] + [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "crawlers"}}}
    ]
    edge = policies["edge-0-network-policy"].inputs["spec"]
    assert edge["ingress"][0]["from"] == [{"ipBlock": {"cidr": c}} for c in clients]


def test_the_pod_waits_for_its_network_policy_config_and_secret(fleet: ProgramResult) -> None:
    """The policy first, so the pod is never reachable without it; the
    ConfigMap and Secret it mounts by name must exist before it starts."""
    for replica in ("pods-0", "pods-1", "edge-0"):
        policy = by_name(fleet, NETWORK_POLICY)[f"{replica}-network-policy"].urn
        waits = set(by_name(fleet, DEPLOYMENT)[f"{replica}-deployment"].dependencies)
        assert policy in waits
        assert by_name(fleet, CONFIG_MAP)[f"{replica}-squid-conf"].urn in waits
        assert by_name(fleet, SECRET)[f"{replica}-auth"].urn in waits
        assert policy in by_name(fleet, SERVICE)[f"{replica}-service"].dependencies


def test_namespace_created_or_used_and_providers_explicit(fleet: ProgramResult) -> None:
    namespaces = by_name(fleet, NAMESPACE)
    assert list(namespaces) == ["cluster-namespace"]  # "edge" uses an existing one
    assert namespaces["cluster-namespace"].inputs["metadata"]["name"] == "egress"
    labels = namespaces["cluster-namespace"].inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    providers = {r.name: r.inputs for r in fleet.resources_of_type("pulumi:providers:kubernetes")}
    assert providers["edge"]["context"] == "edge-ctx"
    assert "kubeconfig" not in providers["cluster"]  # ambient
    # Every backend resource hangs under its proxy's component.
    components = {c.urn: c.name for c in fleet.resources_of_type(PROXY_TYPE)}
    for type_ in (INSTANCE, ADDRESS, CONFIG_MAP, SECRET, DEPLOYMENT, SERVICE, NETWORK_POLICY):
        for resource in fleet.resources_of_type(type_):
            assert resource.name.startswith(components[resource.parent or ""] + "-")


# --- the open firewall guard -----------------------------------------------------


def open_config(allow: bool) -> dict[str, Any]:
    gcp = {"name": "gcp", "type": "gcp", "gcp": {"project": "crawl-proj-1", "region": "us-east1"}}
    where = placement("e2-micro", None, zone="us-east1-b")
    return stack_config(
        [gcp],
        [proxy("open", "gcp", where=where)],
        squid("0.0.0.0/0") | {"allowOpenProxyToTheInternet": allow},
    )


def test_firewall_open_to_the_internet_is_refused_without_the_flag() -> None:
    result = run_program(PROGRAM, open_config(allow=False), new_resource_hook=HOOK)
    assert result.error is not None
    assert result.error.message.splitlines() == [
        "invalid stack config (1 error):",
        "  squid.allowedClients[0]: '0.0.0.0/0' opens the proxies to the whole internet; set "
        "squid.allowOpenProxyToTheInternet: true if that is really meant",
    ]
    assert result.resources == []


def test_firewall_open_to_the_internet_with_the_flag_and_a_warning() -> None:
    result = run_program(PROGRAM, open_config(allow=True), new_resource_hook=HOOK)
    result.raise_for_error()
    (rule,) = result.resources_of_type(FIREWALL)
    assert rule.inputs["sourceRanges"] == ["0.0.0.0/0"]
    assert rule.inputs["allows"] == [{"protocol": "tcp", "ports": ["3128"]}]
    warning = next(line for line in result.stderr.splitlines() if "allowOpenProxy" in line)
    assert "GCP firewall" in warning and "every IPv4 address" in warning
    assert "without squid.auth" in warning
    # No credentials here, and the metadata is a secret all the same: a
    # user's own userData may hold secrets of its own.
    (instance,) = result.resources_of_type(INSTANCE)
    assert "metadata" in instance.secret_inputs


def test_a_cluster_ip_manifest_lists_each_service_by_its_address() -> None:
    # For operators outside the cluster's DNS (on a node, or where the service
    # range is routed): the manifest names the Service's cluster IP.
    cluster = {
        "name": "cluster",
        "type": "kubernetes",
        "kubernetes": {"namespace": "egress", "manifestAddress": "clusterIP"},
    }
    config = stack_config([cluster], [proxy("pods", "cluster", replicas=2)], SQUID)
    result = run_program(PROGRAM, config, new_resource_hook=HOOK).raise_for_error()
    services = by_name(result, SERVICE)
    hosts = {p["name"]: p["host"] for p in result.output("fleet")["proxies"]}
    assert hosts == {
        name: services[f"{name}-service"].outputs["spec"]["clusterIP"]
        for name in ("pods-0", "pods-1")
    }
    assert len(set(hosts.values())) == 2 and all(h.startswith("10.96.0.") for h in hosts.values())
