"""The kubernetes backend through the real Pulumi CLI and the pulumi-kubernetes
plugin, on the one-node cluster of scripts/kube: squid pods that pass their
readiness probes, probed and leased by the discovery service on this machine,
a crawler fetching through them; secrets, no-change previews, drift, a config
change that rolls the pods, the stored NetworkPolicy, an autopilot update
that leaves no copy of the kubeconfig behind, and a destroy that leaves
nothing of the stack.

The steps (`@pytest.mark.step`, tests/support/steps.py) share one stack and
run in file order, each starting from what the one before left: when one
fails, it is named as the step that broke and the later steps skip because
of it. The tests after them stand alone."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from egress_proxies_client import DiscoveryTransport, NoProxyAvailable, lease
from providers.kubernetes.container import container_settings
from providers.kubernetes.workload import CONFIG_HASH_ANNOTATION
from proxyinfra.config import Squid
from proxyinfra.names import proxy_id
from proxyinfra.squid import render_squid_conf
from tests.support.autopilot_cli import scale_by_the_autopilot
from tests.support.discovery import (
    ServiceProcess,
    all_healthy,
    api_client,
    free_port,
    proxies,
    wait_for,
)
from tests.support.kube import Api, Cluster, kube_stack_config
from tests.support.proxyvm import PAGE, PageServer, self_signed
from tests.support.pulumi_cli import CliStack

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli, pytest.mark.kubernetes]

STACK = "kube"
NAMESPACE = "ep-cli-kube"
NAMES = ("pods-0", "pods-1", "pods-2")
TOKEN = "kube-discovery-token-" + "a1b2c3d4" * 3
KINDS = ("ConfigMap", "Secret", "Deployment", "Service", "NetworkPolicy")
TIMES: dict[str, float] = {}


def ids() -> list[str]:
    return [proxy_id("egress-proxies", STACK, name) for name in NAMES]


def ns(path: str = "") -> str:
    return f"/api/v1/namespaces/{NAMESPACE}{path}"


def apps(path: str) -> str:
    return f"/apis/apps/v1/namespaces/{NAMESPACE}{path}"


def uid(api: Api, path: str) -> str:
    found = api.get(path)
    assert found is not None, path
    return str(found["metadata"]["uid"])


def stack_objects(cluster: Cluster, stack: str = STACK) -> list[str]:
    """Every object of the stack in any namespace, by its stack label."""
    selector = f"egress-proxies/stack={stack}"
    found = []
    for path in (
        "/api/v1/configmaps",
        "/api/v1/secrets",
        "/api/v1/services",
        "/api/v1/pods",
        "/apis/apps/v1/deployments",
        "/apis/networking.k8s.io/v1/networkpolicies",
    ):
        for item in cluster.api.items(path, selector):
            found.append(f"{path.rsplit('/', 1)[1]}/{item['metadata']['name']}")
    return found


@pytest.fixture(scope="module")
def stack(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    config = kube_stack_config(kube_cluster, namespace=NAMESPACE, replicas=len(NAMES))
    made = CliStack(
        tmp_path_factory.mktemp("kube") / "project", STACK, config, plugins=("kubernetes",)
    )
    yield made
    if made.resources():
        made.run("destroy", "--yes", "--skip-preview", timeout=600)


@pytest.fixture(scope="module")
def tls(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(kube_cluster.host_address, tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def page(kube_cluster: Cluster, tls: tuple[Path, Path]) -> Iterator[PageServer]:
    """An HTTPS page on this machine's address the pods can reach."""
    with PageServer(kube_cluster.host_address, tls=tls) as server:
        yield server


@pytest.mark.step
def test_preview_lists_every_object_and_creates_nothing(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    done = stack.ok("preview", "--diff")
    out = done.stdout
    for kind in (*KINDS, "Namespace"):
        listed = re.findall(rf"\+ kubernetes:[a-z.0-9/]+:{kind}\b", out)
        assert len(listed) == (1 if kind == "Namespace" else len(NAMES)), (kind, out[-3000:])
    assert "pulumi:providers:kubernetes" in out
    assert kube_cluster.api.get(ns()) is None
    assert stack_objects(kube_cluster) == []


@pytest.mark.step
def test_up_brings_every_pod_to_ready_and_lists_their_addresses(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    started = time.monotonic()
    stack.ok("up", "--yes", "--skip-preview")
    TIMES["up of 3 pods"] = time.monotonic() - started
    api = kube_cluster.api
    for pid in ids():
        # pulumi-kubernetes waited for the rollout: Available when up returns.
        deployment = api.get(apps(f"/deployments/{pid}"))
        assert deployment is not None
        status = deployment["status"]
        assert status.get("availableReplicas") == 1 and status.get("readyReplicas") == 1, status
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions["Available"] == "True"
        pods = api.items(ns("/pods"), f"app.kubernetes.io/instance={pid}")
        assert len(pods) == 1
        ready = {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}
        assert ready["Ready"] == "True" and ready["ContainersReady"] == "True"
        assert pods[0]["spec"]["containers"][0]["image"] == kube_cluster.squid_image
    # The namespace enforces the restricted Pod Security Standard, which the
    # pods above passed; a pod without the proxies' hardening is refused.
    namespace = api.get(f"/api/v1/namespaces/{NAMESPACE}")
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    plain_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-hardened"},
        "spec": {"containers": [{"name": "squid", "image": kube_cluster.squid_image}]},
    }
    refused = api.http.post(ns("/pods"), params={"dryRun": "All"}, json=plain_pod)
    assert refused.status_code == 403 and "violates PodSecurity" in refused.text, refused.text
    fleet = stack.output("fleet")
    entries = {p["name"]: p for p in fleet["proxies"]}
    assert sorted(entries) == sorted(NAMES)
    for name, pid in zip(NAMES, ids(), strict=True):
        service = api.get(ns(f"/services/{pid}"))
        assert service is not None
        entry = entries[name]
        assert entry["type"] == "kubernetes" and entry["id"] == pid and entry["port"] == 3128
        assert entry["host"] == service["spec"]["clusterIP"]
        assert entry["auth"]["username"] == "crawler" and entry["auth"]["password"]


@pytest.mark.step
def test_the_discovery_service_probes_leases_and_a_crawler_fetches_through_a_pod(
    stack: CliStack,
    kube_cluster: Cluster,
    page: PageServer,
    tls: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    args = ["--stack", STACK, "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-target", page.target]
    args += ["--probe-interval", "1", "--lease-cooldown", "600"]
    gateway = free_port()
    args += ["--gateway", f"127.0.0.1:{gateway}", "--gateway-idle", "1"]
    env = {**stack.env(), "DISCOVERY_TOKEN": TOKEN}
    service = ServiceProcess(
        args, log_path=tmp_path / "discovery.log", env=env, cwd=stack.directory
    )
    service.start(timeout=60)
    try:
        with api_client(service.url, TOKEN) as client:
            wait_for(lambda: all_healthy(client, set(NAMES)), timeout=60, interval=0.5)
            pod_ips = {
                p["status"]["podIP"]
                for p in kube_cluster.api.items(ns("/pods"), "egress-proxies/stack=kube")
            }
            # The probes' CONNECTs went through the pods to the page.
            assert page.peers and page.peers <= pod_ips, (page.peers, pod_ips)

            verify = ssl.create_default_context(cafile=str(tls[0]))
            transport = DiscoveryTransport(
                service.url,
                token=TOKEN,
                proxy_transport=lambda url: httpx.AsyncHTTPTransport(proxy=url, verify=verify),
            )
            with httpx.Client(transport=transport, timeout=30) as crawler:
                answer = crawler.get(page.url)
            assert answer.status_code == 200 and answer.content == PAGE
            assert page.clients[-1] in pod_ips

            with lease(service.url, "crawler-1", target=page.url, token=TOKEN, wait=10) as first:
                first.report("blocked")
            listed = proxies(client)
            cooling = [c["target"] for c in listed[first.name]["cooldowns"]]
            assert cooling == [kube_cluster.host_address] and not listed[first.name]["leased"]
            # Only that pod cools down for the site: the other two serve it.
            with ExitStack() as held:
                others = [
                    held.enter_context(lease(service.url, h, target=page.url, token=TOKEN, wait=0))
                    for h in ("crawler-2", "crawler-3")
                ]
                assert {o.name for o in others} == set(NAMES) - {first.name}
                refused = client.post("/v1/leases", json={"holder": "c4", "target": page.url})
                assert refused.status_code == 409, refused.text
                assert float(refused.headers["Retry-After"]) > 0
                with (
                    pytest.raises(NoProxyAvailable),
                    lease(service.url, "c5", target=page.url, token=TOKEN, wait=0),
                ):
                    pass
            # Any client through the gateway, one proxy URL: curl leaves through a pod, not
            # the one cooling down for the site.
            proxy = f"http://curl-session-k:{TOKEN}@127.0.0.1:{gateway}"
            curl = subprocess.run(
                ["curl", "-sS", "--fail", "--cacert", str(tls[0]), "-x", proxy, page.url],
                capture_output=True,
                timeout=60,
            )
            assert curl.returncode == 0, curl.stderr.decode(errors="replace")
            assert curl.stdout == PAGE
            assert page.clients[-1] in pod_ips
            held_by = {
                r["name"]: r["lease"] for r in client.get("/ui/api/status").json()["proxies"]
            }
            assert held_by[first.name] is None
            # Released (the gateway's session after --gateway-idle): nothing is leased any more.
            wait_for(
                lambda: not any(p["leased"] for p in proxies(client).values()),
                timeout=10,
                interval=0.2,
            )
        assert service.terminate() == 0
    finally:
        service.stop()


@pytest.mark.step
def test_no_password_or_hash_outside_the_secret(stack: CliStack, kube_cluster: Cluster) -> None:
    fleet = stack.output("fleet")
    passwords = [p["auth"]["password"] for p in fleet["proxies"]]
    api = kube_cluster.api
    hashes = []
    for pid in ids():
        secret = api.get(ns(f"/secrets/{pid}-auth"))
        assert secret is not None
        line = base64.b64decode(secret["data"]["passwords"]).decode()
        user, _, digest = line.strip().partition(":")
        assert user == "crawler" and digest.startswith("$2")
        hashes.append(digest)
    state = json.dumps(stack.export())
    others = json.dumps(
        [api.items(ns("/configmaps")), api.items(ns("/pods")), api.items(apps("/deployments"))]
    )
    for needle in [*passwords, *hashes]:
        assert needle not in state and needle not in others


@pytest.mark.step
def test_preview_right_after_up_expects_no_changes(stack: CliStack) -> None:
    stack.ok("preview", "--expect-no-changes")


@pytest.mark.step
def test_drift_is_shown_by_refresh_and_repaired_by_up(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    api = kube_cluster.api
    pid = ids()[0]
    want = api.get(ns(f"/configmaps/{pid}"))
    assert want is not None
    api.patch(apps(f"/deployments/{pid}"), {"spec": {"replicas": 0}})
    api.patch(ns(f"/configmaps/{pid}"), {"data": {"squid.conf": "http_port 1\n"}})
    refreshed = stack.ok("refresh", "--yes", "--diff")
    out = refreshed.stdout
    # What changed out of band, as refresh shows it: two objects, and how.
    assert re.search(r"~ 2 updated", out), out[-4000:]
    assert re.search(r"~ replicas\s*: 1 => 0", out), out[-4000:]
    assert re.search(r'~ "?squid\.conf"?\s*: ', out), out[-4000:]
    stack.ok("up", "--yes", "--skip-preview")
    deployment = api.get(apps(f"/deployments/{pid}"))
    assert deployment is not None
    assert (
        deployment["spec"]["replicas"] == 1 and deployment["status"].get("availableReplicas") == 1
    )
    repaired = api.get(ns(f"/configmaps/{pid}"))
    assert repaired is not None and repaired["data"] == want["data"]
    stack.ok("preview", "--expect-no-changes")


@pytest.mark.step
def test_a_squid_change_rolls_the_pods_and_replaces_nothing(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    api = kube_cluster.api
    before = {p["metadata"]["uid"] for p in api.items(ns("/pods"), "egress-proxies/stack=kube")}
    objects = [apps(f"/deployments/{pid}") for pid in ids()]
    objects += [ns(f"/configmaps/{pid}") for pid in ids()]
    objects += [ns(f"/secrets/{pid}-auth") for pid in ids()]
    objects += [ns(f"/services/{pid}") for pid in ids()]
    uids = {path: uid(api, path) for path in objects}
    config = dict(stack.config)
    squid = {**config["squid"], "connectPorts": [*config["squid"]["connectPorts"], "563"]}
    stack.write_config({**config, "squid": squid})
    done = stack.ok("up", "--yes", "--skip-preview")
    assert not re.search(r"\d+ replaced", done.stdout), done.stdout[-3000:]
    # Updated in place: every object keeps its identity.
    assert {path: uid(api, path) for path in objects} == uids
    conf = render_squid_conf(container_settings(Squid.model_validate(squid)))
    digest = hashlib.sha256(conf.encode()).hexdigest()
    for pid in ids():
        deployment = api.get(apps(f"/deployments/{pid}"))
        assert deployment is not None
        template = deployment["spec"]["template"]["metadata"]["annotations"]
        assert template[CONFIG_HASH_ANNOTATION] == digest
        assert deployment["status"].get("updatedReplicas") == 1
        config_map = api.get(ns(f"/configmaps/{pid}"))
        assert config_map is not None and "563" in config_map["data"]["squid.conf"]
    wait_for(
        lambda: {
            p["metadata"]["uid"] for p in api.items(ns("/pods"), "egress-proxies/stack=kube")
        }.isdisjoint(before),
        timeout=120,
        interval=0.5,
        what="the old pods to be gone",
    )
    stack.ok("preview", "--expect-no-changes")


@pytest.mark.step
def test_the_network_policy_the_api_server_stores(stack: CliStack, kube_cluster: Cluster) -> None:
    api = kube_cluster.api
    for pid in ids():
        policy = api.get(f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies/{pid}")
        assert policy is not None
        spec = policy["spec"]
        assert spec["podSelector"] == {
            "matchLabels": {
                "app.kubernetes.io/part-of": "egress-proxies",
                "app.kubernetes.io/instance": pid,
            }
        }
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["ingress"] == [
            {
                "from": [
                    {"ipBlock": {"cidr": kube_cluster.client_cidr}},
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "crawlers"}
                        }
                    },
                ],
                "ports": [{"protocol": "TCP", "port": 3128}],
            }
        ]
        # It selects exactly this proxy's pod.
        pods = api.items(
            ns("/pods"), ",".join(f"{k}={v}" for k, v in spec["podSelector"]["matchLabels"].items())
        )
        assert len(pods) == 1


@pytest.mark.step
def test_an_autopilot_update_leaves_no_copy_of_the_kubeconfig_behind(
    stack: CliStack, kube_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The autopilot's own update (AutomationStack, the edit and targets it
    computes for a scale of `pods` from 3 to 2) on the real plugin.
    pulumi-kubernetes writes a copy of the kubeconfig, client key included,
    to $TMPDIR each time the engine configures it, and never removes it: the
    CLI runs of the steps above left theirs in the stack's own TMPDIR. The
    autopilot runs each command with a TMPDIR of its own and removes it."""
    copies = sorted(stack.tmpdir.glob("kubeconfig*"))
    assert copies, "the plugin wrote no kubeconfig copy: this step's premise is gone"
    assert "client-key-data" in copies[0].read_text()
    for copy in copies:
        copy.unlink()
    assert list(stack.tmpdir.iterdir()) == []
    # The CLI's TMPDIR, in the stack's environment the autopilot is given: stack.tmpdir.
    updated = scale_by_the_autopilot(stack, "pods", 3, 2, monkeypatch)
    assert updated.changes.get("delete"), updated.changes
    gone = ids()[2]
    wait_for(
        lambda: kube_cluster.api.get(apps(f"/deployments/{gone}")) is None,
        timeout=120,
        interval=0.5,
        what=f"deployment {gone} to be gone",
    )
    assert kube_cluster.api.get(apps(f"/deployments/{ids()[1]}")) is not None
    assert list(stack.tmpdir.iterdir()) == []


@pytest.mark.step
def test_destroy_removes_the_stack_s_namespace_and_everything_in_it(
    stack: CliStack, kube_cluster: Cluster
) -> None:
    started = time.monotonic()
    stack.ok("destroy", "--yes", "--skip-preview")
    TIMES["destroy of 2 pods"] = time.monotonic() - started
    api = kube_cluster.api
    wait_for(
        lambda: api.get(ns()) is None, timeout=120, interval=0.5, what="the namespace to be gone"
    )
    assert stack_objects(kube_cluster) == []
    assert stack.resources() == []
    print(
        f"\nkubernetes stack of 3 pods (2 at the destroy): {', '.join(f'{k} {v:.1f}s' for k, v in TIMES.items())}"
    )


# --- a namespace the stack does not own, and bad access ----------------------------------


def test_with_an_existing_namespace_destroy_removes_only_the_stack_s_objects(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    api = kube_cluster.api
    namespace = "ep-cli-shared"
    api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        wait_for(
            lambda: api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default") is not None,
            timeout=120,
            interval=0.5,
            what="the namespace's service account",
        )
        theirs = {"metadata": {"name": "not-the-stack-s"}, "data": {"k": "v"}}
        api.create(f"/api/v1/namespaces/{namespace}/configmaps", theirs)
        config = kube_stack_config(
            kube_cluster, namespace=namespace, replicas=1, create_namespace=False
        )
        stack = CliStack(tmp_path / "project", "shared", config, plugins=("kubernetes",))
        stack.ok("up", "--yes", "--skip-preview")
        assert len(stack_objects(kube_cluster, "shared")) >= len(KINDS)
        stack.ok("destroy", "--yes", "--skip-preview")
        assert stack_objects(kube_cluster, "shared") == []
        assert api.get(f"/api/v1/namespaces/{namespace}") is not None
        kept = api.get(f"/api/v1/namespaces/{namespace}/configmaps/not-the-stack-s")
        assert kept is not None and kept["data"] == {"k": "v"}
    finally:
        api.delete(f"/api/v1/namespaces/{namespace}")


def bad_access_preview(kube_cluster: Cluster, tmp_path: Path, **access: str) -> str:
    config = kube_stack_config(kube_cluster, namespace="ep-cli-bad", replicas=1)
    config["providers"][0]["kubernetes"].update(access)
    stack = CliStack(tmp_path / "project", "bad", config, plugins=("kubernetes",))
    done = stack.run("preview", timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "Traceback" not in out and "panic" not in out, out[-3000:]
    assert re.search(r"invalid stack config \(1 error\)", out), out[-3000:]
    assert stack.resources() == []
    assert kube_cluster.api.get("/api/v1/namespaces/ep-cli-bad") is None
    return out


def test_a_kubeconfig_that_does_not_exist_is_named(kube_cluster: Cluster, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kubeconfig"
    out = bad_access_preview(kube_cluster, tmp_path, kubeconfig=str(missing))
    assert f"providers[0].kubernetes.kubeconfig: file not found: {missing}" in out, out[-3000:]


def test_a_context_that_does_not_exist_is_named(kube_cluster: Cluster, tmp_path: Path) -> None:
    out = bad_access_preview(kube_cluster, tmp_path, context="prod-eu")
    assert (
        f"context 'prod-eu' is not in kubeconfig {kube_cluster.kubeconfig} "
        "(contexts: egress-proxies-kube)"
    ) in out, out[-3000:]


def test_an_api_server_that_is_down_is_named_without_a_hang(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    down = tmp_path / "down.kubeconfig"
    text = kube_cluster.kubeconfig.read_text()
    down.write_text(
        re.sub(r"server: https://127\.0\.0\.1:\d+", f"server: https://127.0.0.1:{port}", text)
    )
    out = bad_access_preview(kube_cluster, tmp_path, kubeconfig=str(down))
    assert (
        f"cannot reach the Kubernetes API server https://127.0.0.1:{port} "
        f"(context 'egress-proxies-kube' of kubeconfig {down}): Connection refused"
    ) in out, out[-3000:]
