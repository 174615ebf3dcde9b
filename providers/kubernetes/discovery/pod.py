"""The discovery service's pods: `python -m discovery serve` on the fleet
Secret's file, its token and store from Secrets through the environment
(never in the spec), probed on its health endpoints, locked down to the
restricted Pod Security Standard, rolled one new pod at a time.

Shutdown: the pod leaves the Service's endpoints when deletion starts, but
kube-proxy and load balancers learn it a moment later, so the container
waits PRE_STOP_S before SIGTERM reaches the service, which then finishes
in-flight requests (up to discovery.cli.GRACEFUL_SHUTDOWN_S) and exits 0.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from providers.kubernetes.discovery.names import (
    API_PORT_NAME,
    APP_UID,
    FLEET_KEY,
    selector,
)
from providers.kubernetes.discovery.network import ports
from providers.kubernetes.restricted import container_security, pod_security
from proxyinfra.backend import DiscoveryRequest

core = k8s.core.v1
meta = k8s.meta.v1
apps = k8s.apps.v1

FLEET_DIR = "/etc/egress-discovery/fleet"
PRE_STOP_S = 5
GRACEFUL_S = 10  # discovery.cli.GRACEFUL_SHUTDOWN_S: in-flight requests and queued writes
TOKEN_ENV = "DISCOVERY_TOKEN"  # discovery.cli's names
DB_ENV = "DISCOVERY_DB"


def _number(value: float) -> str:
    return f"{value:g}"


def args(request: DiscoveryRequest) -> list[str]:
    config = request.config
    listed = [
        "serve",
        "--fleet",
        f"{FLEET_DIR}/{FLEET_KEY}",
        "--listen",
        f"0.0.0.0:{config.port}",
        *(arg for target in config.probe_target for arg in ("--probe-target", target)),
        "--probe-interval",
        _number(config.probe_interval),
        "--lease-cooldown",
        _number(config.lease_cooldown),
        "--max-lease-ttl",
        _number(config.max_lease_ttl),
    ]
    if config.gateway is not None:
        listed += ["--gateway", f"0.0.0.0:{config.gateway.port}"]
    return listed


def _secret_env(name: str, secret: pulumi.Input[str], key: str) -> core.EnvVarArgs:
    return core.EnvVarArgs(
        name=name,
        value_from=core.EnvVarSourceArgs(
            secret_key_ref=core.SecretKeySelectorArgs(name=secret, key=key)
        ),
    )


def _probe(path: str, period: int, failures: int) -> core.ProbeArgs:
    return core.ProbeArgs(
        http_get=core.HTTPGetActionArgs(path=path, port=API_PORT_NAME),
        period_seconds=period,
        timeout_seconds=3,
        failure_threshold=failures,
    )


def deployment_spec(
    request: DiscoveryRequest,
    labels: dict[str, str],
    service_account: pulumi.Input[str],
    fleet_secret: pulumi.Input[str],
    token: tuple[pulumi.Input[str], str],
    database: tuple[pulumi.Input[str], str],
) -> apps.DeploymentSpecArgs:
    config = request.config
    resources = config.resources
    container = core.ContainerArgs(
        name="discovery",
        image=config.image,
        image_pull_policy="IfNotPresent",
        args=args(request),
        env=[
            _secret_env(TOKEN_ENV, *token),
            _secret_env(DB_ENV, *database),
        ],
        ports=[
            core.ContainerPortArgs(name=name, container_port=port, protocol="TCP")
            for name, port in ports(request)
        ],
        # /readyz: the store open, the fleet read, probes running; /healthz:
        # the process answers (a failing store makes it unready, not dead).
        readiness_probe=_probe("/readyz", period=2, failures=2),
        liveness_probe=_probe("/healthz", period=10, failures=3),
        startup_probe=_probe("/healthz", period=1, failures=60),
        lifecycle=core.LifecycleArgs(
            pre_stop=core.LifecycleHandlerArgs(sleep=core.SleepActionArgs(seconds=PRE_STOP_S))
        ),
        resources=core.ResourceRequirementsArgs(
            requests={"cpu": resources.cpu_request, "memory": resources.memory_request},
            limits={"cpu": resources.cpu_limit, "memory": resources.memory_limit},
        ),
        security_context=container_security(),
        volume_mounts=[
            core.VolumeMountArgs(name="fleet", mount_path=FLEET_DIR, read_only=True),
            core.VolumeMountArgs(name="tmp", mount_path="/tmp"),
        ],
    )
    return apps.DeploymentSpecArgs(
        replicas=config.replicas,
        selector=meta.LabelSelectorArgs(match_labels=selector(request, "discovery")),
        # A new pod is Ready before an old one goes: never zero ready replicas.
        strategy=apps.DeploymentStrategyArgs(
            type="RollingUpdate",
            rolling_update=apps.RollingUpdateDeploymentArgs(max_unavailable=0, max_surge=1),
        ),
        template=core.PodTemplateSpecArgs(
            metadata=meta.ObjectMetaArgs(labels=labels),
            spec=core.PodSpecArgs(
                service_account_name=service_account,
                # It reads nothing of the Kubernetes API: no token to steal.
                automount_service_account_token=False,
                enable_service_links=False,
                containers=[container],
                volumes=[
                    # A directory mount (not subPath): the kubelet swaps the
                    # file in place when the Secret changes, which the
                    # service's fleet reload sees (its inode changes).
                    core.VolumeArgs(
                        name="fleet",
                        secret=core.SecretVolumeSourceArgs(
                            secret_name=fleet_secret, default_mode=0o440
                        ),
                    ),
                    core.VolumeArgs(
                        name="tmp",
                        empty_dir=core.EmptyDirVolumeSourceArgs(medium="Memory", size_limit="16Mi"),
                    ),
                ],
                security_context=pod_security(APP_UID),
                termination_grace_period_seconds=PRE_STOP_S + GRACEFUL_S + 10,
                affinity=core.AffinityArgs(
                    pod_anti_affinity=core.PodAntiAffinityArgs(
                        preferred_during_scheduling_ignored_during_execution=[
                            core.WeightedPodAffinityTermArgs(
                                weight=100,
                                pod_affinity_term=core.PodAffinityTermArgs(
                                    label_selector=meta.LabelSelectorArgs(
                                        match_labels=selector(request, "discovery")
                                    ),
                                    topology_key="kubernetes.io/hostname",
                                ),
                            )
                        ]
                    )
                ),
            ),
        ),
    )
