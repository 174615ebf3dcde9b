"""The discovery service the stack deploys itself (egress-proxies:discovery),
through the real Pulumi CLI on the one-node cluster of scripts/kube: 3 squid
pods and 2 replicas of the service on the stack's own PostgreSQL pod, from
one `pulumi up`. From this machine, through the Service's cluster IP, a
crawler leases a pod and fetches a page; the fleet changes by `up` without a
restart, and by the autopilot's targeted update; a replica's pod dies during lease churn; a rolling update keeps
grants answering; no secret in plain text; bad config named before any
resource; `destroy` leaves nothing.

The steps share one stack and run in file order (tests/support/steps.py)."""

from __future__ import annotations

import base64
import ipaddress
import itertools
import json
import os
import shutil
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxies_client import lease
from tests.support.autopilot_cli import scale_by_the_autopilot
from tests.support.discovery import api_client, proxies, wait_for
from tests.support.kube import Cluster, kube_stack_config
from tests.support.proxyvm import PAGE, PageServer, self_signed
from tests.support.pulumi_cli import CliStack
from tests.support.stack_config import external_provider, proxy

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli, pytest.mark.kubernetes]

STACK = "disc"
NAMESPACE = "ep-cli-disc"
STORAGE_CLASS = "ep-cli-disc"
PV = "ep-cli-disc-pg"
TIMES: dict[str, float] = {}


def ns(path: str = "") -> str:
    return f"/api/v1/namespaces/{NAMESPACE}{path}"


def discovery_config(cluster: Cluster, probe_target: str, **overrides: Any) -> dict[str, Any]:
    config = kube_stack_config(cluster, namespace=NAMESPACE, replicas=3)
    # squid admits the service's pods too (their probes and the gateway's
    # tunnels come from pod addresses): the pods' network, the bridge's /24.
    pods = ipaddress.ip_network(f"{cluster.host_address}/24", strict=False)
    config["squid"]["allowedClients"] = [cluster.client_cidr, str(pods)]
    config["discovery"] = {
        "provider": "cluster",
        "replicas": 2,
        "image": cluster.discovery_image,
        "allowedClients": [cluster.client_cidr],
        "probeTarget": probe_target,
        "probeInterval": 1,
        "resources": {"cpuRequest": "10m", "memoryRequest": "64Mi"},
        "database": {
            "postgres": {
                "image": cluster.postgres_image,
                "storage": "256Mi",
                "storageClass": STORAGE_CLASS,
            }
        },
        **overrides,
    }
    return config


@pytest.fixture(scope="module")
def tls(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(kube_cluster.host_address, tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def page(kube_cluster: Cluster, tls: tuple[Path, Path]) -> Iterator[PageServer]:
    with PageServer(kube_cluster.host_address, tls=tls) as server:
        yield server


@pytest.fixture(scope="module")
def volume(kube_cluster: Cluster) -> Iterator[str]:
    """A PersistentVolume for the stack's claim (the cluster has no
    provisioner): a directory on this machine, owned by the postgres image's user."""
    directory = Path(f"/tmp/ep-cli-disc-pg-{os.getpid()}")
    directory.mkdir(mode=0o700)
    os.chown(directory, 999, 999)
    api = kube_cluster.api
    api.delete(f"/api/v1/persistentvolumes/{PV}")
    wait_for(lambda: api.get(f"/api/v1/persistentvolumes/{PV}") is None, timeout=60, interval=0.5)
    api.create(
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": PV},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE_CLASS,
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(directory), "type": "Directory"},
            },
        },
    )
    yield str(directory)
    api.delete(f"/api/v1/persistentvolumes/{PV}")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(
    kube_cluster: Cluster, page: PageServer, volume: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CliStack]:
    config = discovery_config(kube_cluster, page.target)
    made = CliStack(
        tmp_path_factory.mktemp("disc") / "project", STACK, config, plugins=("kubernetes",)
    )
    yield made
    if made.resources():
        made.run("destroy", "--yes", "--skip-preview", timeout=600)


def service_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.api.items(ns("/pods"), "app.kubernetes.io/component=discovery")


def deployment(cluster: Cluster, component: str) -> dict[str, Any]:
    found = cluster.api.items(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
        f"app.kubernetes.io/component={component}",
    )
    assert len(found) == 1, found
    return found[0]


def credentials(stack: CliStack) -> tuple[str, str]:
    return stack.output("discoveryUrl"), stack.output("discoveryToken")


def lease_each(client: httpx.Client, names: set[str]) -> dict[str, dict[str, Any]]:
    """A lease on each of NAMES, by name. A 409 is waited out: with probes every
    second, a pod proxy slow to answer two of them on this busy machine is
    judged unhealthy until its next good one (a grant refused then says
    "1 not healthy"); any other answer fails at once, with its body."""
    held: dict[str, dict[str, Any]] = {}

    def one_more() -> bool:
        answer = client.post("/v1/leases", json={"holder": f"h{len(held)}"})
        assert answer.status_code in (201, 409), answer.text
        if answer.status_code == 201:
            held[answer.json()["proxy"]["name"]] = answer.json()
        return set(held) == names

    wait_for(one_more, timeout=60, interval=0.5, what=f"a lease on each of {sorted(names)}")
    return held


@pytest.mark.step
def test_up_makes_the_service_ready_and_a_crawler_fetches_through_a_pod(
    stack: CliStack, kube_cluster: Cluster, page: PageServer, tls: tuple[Path, Path]
) -> None:
    started = time.monotonic()
    stack.ok("up", "--yes", "--skip-preview")
    TIMES["up (3 proxy pods, 2 replicas, PostgreSQL)"] = time.monotonic() - started
    # pulumi-kubernetes awaited the rollout: both replicas Ready when up returns.
    status = deployment(kube_cluster, "discovery")["status"]
    assert status.get("readyReplicas") == 2 and status.get("availableReplicas") == 2, status
    url, token = credentials(stack)
    service = kube_cluster.api.items(ns("/services"), "app.kubernetes.io/component=discovery")
    assert url == f"http://{service[0]['spec']['clusterIP']}:8080"
    assert len(token) >= 32
    with api_client(url, token) as client:
        assert (
            client.get(
                "/v1/proxies", headers={"Authorization": "Bearer wrong-token-0000000"}
            ).status_code
            == 401
        )
        names = {"pods-0", "pods-1", "pods-2"}
        wait_for(
            lambda: {n for n, p in proxies(client).items() if p["health"] == "healthy"} == names,
            timeout=120,
            interval=1,
            what="the three pods healthy by the in-cluster service's probes",
        )
        verify = ssl.create_default_context(cafile=str(tls[0]))
        with lease(url, "crawler-1", target=page.url, token=token, wait=30) as held:
            with httpx.Client(proxy=held.url, verify=verify, timeout=30) as crawler:
                answer = crawler.get(page.url)
            assert answer.status_code == 200 and answer.content == PAGE
            held.report("blocked")
        listed = proxies(client)
        assert [c["target"] for c in listed[held.name]["cooldowns"]] == [kube_cluster.host_address]
        assert not listed[held.name]["leased"]  # released
        grant = client.post("/v1/leases", json={"holder": "c2", "target": page.url})
        assert grant.status_code == 201 and grant.json()["proxy"]["name"] != held.name
        assert client.delete(f"/v1/leases/{grant.json()['id']}").status_code == 204


@pytest.mark.step
def test_no_secret_in_plain_text_outside_secrets(stack: CliStack, kube_cluster: Cluster) -> None:
    api = kube_cluster.api
    url, token = credentials(stack)
    fleet = stack.output("fleet")
    database = next(s for s in api.items(ns("/secrets"), "app.kubernetes.io/component=database"))
    db_url = base64.b64decode(database["data"]["url"]).decode()
    db_password = base64.b64decode(database["data"]["password"]).decode()
    needles = [token, db_url, db_password] + [p["auth"]["password"] for p in fleet["proxies"]]
    state = json.dumps(stack.export())
    objects = json.dumps(
        [
            api.items(ns("/configmaps")),
            api.items(ns("/pods")),
            api.items(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"),
        ]
    )
    logs = ""
    for pod in service_pods(kube_cluster):
        answer = api.http.get(ns(f"/pods/{pod['metadata']['name']}/log"))
        answer.raise_for_status()
        logs += answer.text
    assert "starting" in logs  # the service's own lines are there
    for needle in needles:
        assert needle not in state, "in pulumi stack export"
        assert needle not in objects, "in a ConfigMap, pod or Deployment"
        assert needle not in logs, "in the service's logs"
    assert url.startswith("http://")


@pytest.mark.step
def test_a_fleet_change_reaches_the_running_service_without_a_restart(
    stack: CliStack, kube_cluster: Cluster, page: PageServer
) -> None:
    url, token = credentials(stack)
    before = {
        p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
        for p in service_pods(kube_cluster)
    }
    with api_client(url, token) as client:
        # Lease every pod; keep the lease on pods-2, which the change removes.
        granted = lease_each(client, {"pods-0", "pods-1", "pods-2"})
        doomed = granted.pop("pods-2")
        for g in granted.values():
            assert client.delete(f"/v1/leases/{g['id']}").status_code == 204
        config = json.loads(json.dumps(stack.config))
        config["proxies"][0]["replicas"] = 2
        config["proxies"].append(proxy("more", "cluster"))
        stack.write_config(config)
        stack.ok("up", "--yes", "--skip-preview")
        names = {"pods-0", "pods-1", "more-0"}
        wait_for(
            lambda: set(proxies(client)) == names,
            timeout=180,
            interval=1,
            what="the running service to serve the new fleet (the Secret's file reloaded)",
        )
        # The removed proxy's lease holder: renew says 404 (docs/discovery.md, Fleet changes).
        renewed = client.post(f"/v1/leases/{doomed['id']}/renew", json={})
        assert renewed.status_code == 404, renewed.text
    after = {
        p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
        for p in service_pods(kube_cluster)
    }
    assert after == before  # the same pods, never restarted


@pytest.mark.step
def test_an_autopilot_scale_reaches_the_running_service(
    stack: CliStack, kube_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The autopilot's targeted update and partial run (issue 40) on a stack
    that runs its own service (issue 41): the fleet Secret is among its
    targets, so the service reloads the new manifest as after a whole `up`."""
    url, token = credentials(stack)
    updated = scale_by_the_autopilot(stack, "more", 1, 2, monkeypatch)
    assert updated.changes.get("create"), updated.changes
    with api_client(url, token) as client:
        wait_for(
            lambda: set(proxies(client)) == {"pods-0", "pods-1", "more-0", "more-1"},
            timeout=180,
            interval=1,
            what="the running service to serve more-1 (the fleet Secret updated by the autopilot)",
        )
    # The partial run left the state a whole run agrees with.
    stack.ok("preview", "--expect-no-changes")


def churn(
    url: str,
    token: str,
    stop: threading.Event,
    record: list[tuple[str, str, float, float]],
    errors: list[str],
    worker: int,
) -> None:
    """Grant, renew, release in a loop; transport errors are retried (a pod
    going away), and every lease granted must renew and release (not lost)."""
    with api_client(url, token) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                grant = client.post(
                    "/v1/leases", json={"holder": f"w{worker}-{n}", "ttlSeconds": 30}
                )
            except httpx.TransportError:
                continue
            if grant.status_code != 201:
                time.sleep(0.05)
                continue
            body = grant.json()
            # [after the grant's answer, before the release is sent]: within
            # the time the service held the lease, whatever the delays.
            start = time.monotonic()
            end = start
            for step in ("renew", "release"):
                if step == "release":
                    end = time.monotonic()
                while True:
                    try:
                        answer = (
                            client.post(f"/v1/leases/{body['id']}/renew", json={})
                            if step == "renew"
                            else client.delete(f"/v1/leases/{body['id']}")
                        )
                    except httpx.TransportError:
                        continue
                    if answer.status_code in (503, 502):
                        continue
                    if answer.status_code not in (200, 204):
                        errors.append(f"{step} of {body['id']}: {answer.status_code} {answer.text}")
                    break
            record.append((body["proxy"]["name"], body["id"], start, end))


@pytest.mark.step
def test_a_replica_s_pod_deleted_during_lease_churn_loses_and_doubles_no_lease(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    url, token = credentials(stack)
    stop, record, errors = threading.Event(), [], []  # type: ignore[var-annotated]
    workers = [
        threading.Thread(target=churn, args=(url, token, stop, record, errors, i)) for i in range(4)
    ]
    for w in workers:
        w.start()
    try:
        time.sleep(3)
        victim = service_pods(kube_cluster)[0]["metadata"]["name"]
        kube_cluster.api.delete(ns(f"/pods/{victim}"))
        wait_for(
            lambda: (
                len(
                    [
                        p
                        for p in service_pods(kube_cluster)
                        if p["metadata"]["name"] != victim
                        and all(
                            c["ready"]
                            for c in p["status"].get("containerStatuses", [{"ready": False}])
                        )
                    ]
                )
                == 2
            ),
            timeout=120,
            interval=0.5,
            what="a new replica Ready in the deleted one's place",
        )
        time.sleep(3)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    assert errors == []
    assert len(record) > 20, len(record)
    # No proxy was held by two leases at once.
    by_proxy: dict[str, list[tuple[float, float]]] = {}
    for name, _, start, end in record:
        by_proxy.setdefault(name, []).append((start, end))
    for name, held in by_proxy.items():
        held.sort()
        for (_, first_end), (second_start, _) in itertools.pairwise(held):
            assert second_start >= first_end, f"{name} leased twice at once"
    ids = [lease_id for _, lease_id, _, _ in record]
    assert len(ids) == len(set(ids))
    print(f"\nchurn across the pod's deletion: {len(record)} leases, none lost or doubled")


@pytest.mark.step
def test_a_rolling_update_keeps_grants_answering(stack: CliStack, kube_cluster: Cluster) -> None:
    url, token = credentials(stack)
    answers: list[int | str] = []
    stop = threading.Event()

    def grant(client: httpx.Client) -> httpx.Response:
        return client.post("/v1/leases", json={"holder": "roller", "ttlSeconds": 5})

    def ask() -> None:
        with api_client(url, token) as client:
            while not stop.is_set():
                try:
                    try:
                        answer = grant(client)
                    except httpx.TransportError:
                        # A kept-alive connection to a pod that has just shut
                        # down: a client's one retry, on a new connection.
                        answer = grant(client)
                    answers.append(answer.status_code)
                    if answer.status_code == 201:
                        client.delete(f"/v1/leases/{answer.json()['id']}")
                except httpx.TransportError as error:
                    answers.append(type(error).__name__)
                time.sleep(0.1)

    old = {p["metadata"]["uid"] for p in service_pods(kube_cluster)}
    asker = threading.Thread(target=ask)
    asker.start()
    try:
        config = json.loads(json.dumps(stack.config))
        config["discovery"]["leaseCooldown"] = 300
        stack.write_config(config)
        started = time.monotonic()
        stack.ok("up", "--yes", "--skip-preview")
        TIMES["rolling update"] = time.monotonic() - started
    finally:
        stop.set()
        asker.join(timeout=30)

    # The new pods are ready when `up` returns; the old ones leave as the old
    # ReplicaSet scales down, each within its grace period.
    def replaced() -> bool:
        staying = [
            p for p in service_pods(kube_cluster) if not p["metadata"].get("deletionTimestamp")
        ]
        return len(staying) == 2 and {p["metadata"]["uid"] for p in staying}.isdisjoint(old)

    wait_for(replaced, timeout=90, interval=1)
    assert len(answers) > 20 and set(answers) <= {201, 409}, sorted(set(map(str, answers)))


def bad_preview(cluster: Cluster, tmp_path: Path, **overrides: Any) -> str:
    config = discovery_config(cluster, "example.com:443", **overrides)
    config["providers"][0]["kubernetes"]["namespace"] = "ep-cli-disc-bad"
    config["providers"].append(external_provider("corp"))  # a provider that is not kubernetes
    made = CliStack(tmp_path / "project", "bad", config, plugins=("kubernetes",))
    done = made.run("preview", timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert made.resources() == []
    assert cluster.api.get("/api/v1/namespaces/ep-cli-disc-bad") is None
    return out


def test_bad_config_is_named_before_any_resource(kube_cluster: Cluster, tmp_path: Path) -> None:
    out = bad_preview(
        kube_cluster,
        tmp_path / "a",
        database={"existingSecret": {"name": "no-such-db", "key": "url"}},
    )
    assert (
        "discovery.database.existingSecret: Secret 'no-such-db' does not exist in namespace "
        "'ep-cli-disc-bad'"
    ) in out, out[-3000:]
    out = bad_preview(kube_cluster, tmp_path / "b", port=3128, provider="elsewhere")
    assert "discovery.port: 3128 is the proxies' port (squid.port); pick another" in out
    assert "discovery.provider: unknown provider 'elsewhere' (kubernetes providers: cluster)" in out
    out = bad_preview(kube_cluster, tmp_path / "c", provider="corp")
    assert (
        "discovery.provider: 'corp' is an external provider; the discovery service runs on a "
        "kubernetes provider entry"
    ) in out, out[-3000:]


@pytest.mark.step
def test_destroy_removes_the_service_its_secrets_and_its_database(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    started = time.monotonic()
    stack.ok("destroy", "--yes", "--skip-preview")
    TIMES["destroy"] = time.monotonic() - started
    api = kube_cluster.api
    wait_for(lambda: api.get(ns()) is None, timeout=180, interval=0.5, what="the namespace gone")
    for path in (
        "/api/v1/secrets",
        "/api/v1/persistentvolumeclaims",
        "/api/v1/pods",
        "/api/v1/services",
    ):
        assert api.items(path, f"egress-proxies/stack={STACK}") == [], path
    assert stack.resources() == []
    print(f"\ndiscovery stack: {', '.join(f'{k} {v:.1f}s' for k, v in TIMES.items())}")
