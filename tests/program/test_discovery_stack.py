"""The stack program under mocks with egress-proxies:discovery: what it
registers on the kubernetes provider entry (the service's pods, Secrets,
PodDisruptionBudget, Service, NetworkPolicy, ServiceAccount, and the stack's
own PostgreSQL), the outputs `discoveryUrl` and `discoveryToken`, and that no
secret value stands anywhere but in a Secret or a secret output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.program import ProgramResult, RegisteredResource, run_program
from tests.support.mock_clouds import DYNAMIC, HOOK
from tests.support.stack_config import external_provider, proxy, squid, stack_config

PROGRAM = "proxyinfra.program:main"
SECRET = "kubernetes:core/v1:Secret"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
IMAGE = "localhost/egress-proxies/discovery:1@sha256:" + "ab" * 32
PG_IMAGE = "localhost/egress-proxies/postgres:15@sha256:" + "cd" * 32


def config(**discovery: Any) -> dict[str, Any]:
    cluster = {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress"}}
    raw = stack_config(
        [cluster, external_provider()],
        [proxy("pods", "cluster", replicas=2), proxy("corp-1", "corp", url="http://10.0.0.5:8000")],
        squid("10.0.0.0/8", username="crawler"),
    )
    raw["discovery"] = {
        "provider": "cluster",
        "replicas": 2,
        "image": IMAGE,
        "allowedClients": ["10.1.0.0/16"],
        "clientNamespaces": ["crawlers"],
        "gateway": {"port": 8081},
        "database": {"postgres": {"image": PG_IMAGE, "storage": "2Gi"}},
        **discovery,
    }
    return raw


@pytest.fixture(scope="module")
def made() -> ProgramResult:
    return run_program(PROGRAM, config(), new_resource_hook=HOOK).raise_for_error()


def one(result: ProgramResult, name: str) -> RegisteredResource:
    return result.resource(name)


def test_the_service_s_pods_roll_safely_and_take_secrets_by_reference(made: ProgramResult) -> None:
    deployment = one(made, "discovery-deployment").inputs
    base = deployment["metadata"]["name"]
    assert base.startswith("discovery-") and deployment["metadata"]["namespace"] == "egress"
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == base
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "api"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["args"][:5] == [
        "serve",
        "--fleet",
        "/etc/egress-discovery/fleet/fleet.json",
        "--listen",
        "0.0.0.0:8080",
    ]
    assert container["args"][-2:] == ["--gateway", "0.0.0.0:8081"]
    # Values by reference only: no `value` in any variable.
    env = {e["name"]: e for e in container["env"]}
    assert set(env) == {"DISCOVERY_TOKEN", "DISCOVERY_DB"}
    assert all("value" not in e for e in env.values())
    assert env["DISCOVERY_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{base}-token",
        "key": "token",
    }
    assert env["DISCOVERY_DB"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{base}-postgres",
        "key": "url",
    }
    fleet_volume = next(v for v in pod["volumes"] if v["name"] == "fleet")
    assert fleet_volume["secret"]["secretName"] == f"{base}-fleet"
    budget = one(made, "discovery-disruption-budget").inputs["spec"]
    assert budget["maxUnavailable"] == 1
    account = one(made, "discovery-service-account").inputs
    assert account["automountServiceAccountToken"] is False
    # No Role or binding: the account may do nothing.
    assert not [r for r in made.resources if "rbac.authorization" in r.type]


def test_the_fleet_secret_is_the_stack_s_own_manifest(made: ProgramResult) -> None:
    secret = one(made, "discovery-fleet-secret")
    assert "stringData" in secret.secret_inputs
    assert json.loads(secret.inputs["stringData"]["fleet.json"]) == made.output("fleet")


def test_the_service_and_its_network_policy(made: ProgramResult) -> None:
    service = one(made, "discovery-service").inputs["spec"]
    assert service["type"] == "ClusterIP"
    assert [(p["name"], p["port"]) for p in service["ports"]] == [("api", 8080), ("gateway", 8081)]
    policy = one(made, "discovery-network-policy").inputs["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    assert ingress["from"] == [
        {"ipBlock": {"cidr": "10.1.0.0/16"}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "crawlers"}}},
    ]
    assert [p["port"] for p in ingress["ports"]] == [8080, 8081]
    proxies, database, dns = policy["egress"]
    # squid's port and the external proxy's own.
    assert [p["port"] for p in proxies["ports"]] == [3128, 8000]
    assert (
        database["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "database"
    )
    assert [p["port"] for p in database["ports"]] == [5432]
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    db_policy = one(made, "discovery-database-network-policy").inputs["spec"]
    assert db_policy["egress"] == [] and db_policy["policyTypes"] == ["Ingress", "Egress"]


def test_the_stack_s_postgres_pod_volume_and_password(made: ProgramResult) -> None:
    claim = one(made, "discovery-database-volume").inputs["spec"]
    assert claim["resources"]["requests"] == {"storage": "2Gi"}
    deployment = one(made, "discovery-database").inputs["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    (container,) = deployment["template"]["spec"]["containers"]
    assert container["image"] == PG_IMAGE
    assert {e["name"]: e.get("value") for e in container["env"]}["POSTGRES_PASSWORD_FILE"]
    password = next(
        r for r in made.resources_of_type(DYNAMIC) if r.name == "discovery-database-password"
    )
    secret = one(made, "discovery-database-secret")
    assert secret.inputs["stringData"]["password"] == password.outputs["value"]
    url = secret.inputs["stringData"]["url"]
    assert url.startswith(f"postgresql://discovery:{password.outputs['value']}@discovery-")
    assert url.endswith(".egress.svc.cluster.local:5432/postgres")


def test_outputs_url_and_secret_token(made: ProgramResult) -> None:
    base = one(made, "discovery-deployment").inputs["metadata"]["name"]
    assert made.output("discoveryUrl") == f"http://{base}.egress.svc.cluster.local:8080"
    token = next(r for r in made.resources_of_type(DYNAMIC) if r.name == "discovery-token")
    assert made.output("discoveryToken") == token.outputs["value"]
    assert made.is_secret("discoveryToken") and made.is_secret("fleet")


def test_no_secret_value_outside_secrets(made: ProgramResult) -> None:
    needles = [
        r.outputs["value"]
        for r in made.resources_of_type(DYNAMIC)
        if r.name.startswith("discovery-")
    ]
    needles += [p["auth"]["password"] for p in made.output("fleet")["proxies"] if "auth" in p]
    assert len(needles) == 4
    for resource in made.resources:
        if resource.type == SECRET or resource.type == DYNAMIC:
            continue
        text = json.dumps(resource.inputs)
        for needle in needles:
            assert needle not in text, (resource.name, needle)


def test_existing_secrets_instead_of_generated_ones(tmp_path: Path) -> None:
    raw = config(
        token={"existingSecret": {"name": "crawler-token", "key": "token"}},
        database={"existingSecret": {"name": "managed-db", "key": "url"}, "port": 6432},
        service={"type": "NodePort", "nodeAddress": "192.0.2.7"},
        gateway=None,
    )
    del raw["discovery"]["gateway"]
    result = run_program(PROGRAM, raw, new_resource_hook=HOOK).raise_for_error()
    names = set(result.names())
    assert not {"discovery-token", "discovery-token-secret", "discovery-database"} & names
    (container,) = one(result, "discovery-deployment").inputs["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env == {
        "DISCOVERY_TOKEN": {"name": "crawler-token", "key": "token"},
        "DISCOVERY_DB": {"name": "managed-db", "key": "url"},
    }
    egress = one(result, "discovery-network-policy").inputs["spec"]["egress"]
    assert [p["port"] for p in egress[1]["ports"]] == [6432] and "to" not in egress[1]
    # The token crawlers are given is the existing Secret's, read through the API.
    assert result.output("discoveryToken") == "existing-token-0123456789"
    assert result.is_secret("discoveryToken")
    assert one(result, "discovery-service").inputs["spec"]["type"] == "NodePort"
    assert result.output("discoveryUrl") == "http://192.0.2.7:30000"


def test_every_probe_target_reaches_the_service_in_its_order() -> None:
    targets = ["probe-a.example:443", "probe-b.example:443"]
    result = run_program(PROGRAM, config(probeTarget=targets), new_resource_hook=HOOK)
    pod = one(result.raise_for_error(), "discovery-deployment").inputs["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    given = [args[i + 1] for i, arg in enumerate(args) if arg == "--probe-target"]
    assert given == targets
