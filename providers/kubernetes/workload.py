"""The proxy's pod: one squid container, locked down, probed, with limits."""

from __future__ import annotations

import hashlib

import pulumi_kubernetes as k8s

from providers.kubernetes.config import KubernetesProvider
from providers.kubernetes.container import (
    AUTH_DIR,
    CONFIG_DIR,
    CONFIG_KEY,
    PASSWORDS_KEY,
    RUN_DIR,
    SPOOL_DIR,
    SQUID_ARGS,
    SQUID_COMMAND,
    SQUID_UID,
)
from providers.kubernetes.labels import selector, stack_selector
from providers.kubernetes.restricted import container_security, pod_security
from proxyinfra.backend import ProxyRequest

core = k8s.core.v1
meta = k8s.meta.v1

PORT_NAME = "proxy"
CONFIG_HASH_ANNOTATION = "egress-proxies/squid-conf-sha256"


def _probe(initial_delay: int, period: int, timeout: int) -> core.ProbeArgs:
    # A TCP connect: squid answers HTTP only to allowedClients, and the
    # kubelet's address is not one of them.
    return core.ProbeArgs(
        tcp_socket=core.TCPSocketActionArgs(port=PORT_NAME),
        initial_delay_seconds=initial_delay,
        period_seconds=period,
        timeout_seconds=timeout,
        failure_threshold=3,
    )


def _container(request: ProxyRequest, k8s_config: KubernetesProvider) -> core.ContainerArgs:
    mounts = [
        core.VolumeMountArgs(name="config", mount_path=CONFIG_DIR, read_only=True),
        core.VolumeMountArgs(name="run", mount_path=RUN_DIR),
        core.VolumeMountArgs(name="spool", mount_path=SPOOL_DIR),
    ]
    if request.credentials is not None:
        mounts.append(core.VolumeMountArgs(name="auth", mount_path=AUTH_DIR, read_only=True))
    return core.ContainerArgs(
        name="squid",
        image=k8s_config.image,
        image_pull_policy="IfNotPresent",
        command=SQUID_COMMAND,
        args=SQUID_ARGS,
        ports=[
            core.ContainerPortArgs(
                name=PORT_NAME, container_port=request.squid.port, protocol="TCP"
            )
        ],
        readiness_probe=_probe(initial_delay=2, period=10, timeout=2),
        liveness_probe=_probe(initial_delay=15, period=20, timeout=5),
        resources=core.ResourceRequirementsArgs(
            requests={"cpu": k8s_config.cpu_request, "memory": k8s_config.memory_request},
            limits={"cpu": k8s_config.cpu_limit, "memory": k8s_config.memory_limit},
        ),
        security_context=container_security(),
        volume_mounts=mounts,
    )


def _volumes(request: ProxyRequest, config_map: str, secret: str | None) -> list[core.VolumeArgs]:
    volumes = [
        core.VolumeArgs(
            name="config",
            config_map=core.ConfigMapVolumeSourceArgs(
                name=config_map,
                items=[core.KeyToPathArgs(key=CONFIG_KEY, path=CONFIG_KEY)],
                default_mode=0o444,
            ),
        ),
        core.VolumeArgs(
            name="run", empty_dir=core.EmptyDirVolumeSourceArgs(medium="Memory", size_limit="1Mi")
        ),
        core.VolumeArgs(name="spool", empty_dir=core.EmptyDirVolumeSourceArgs(size_limit="64Mi")),
    ]
    if secret is not None:
        volumes.append(
            core.VolumeArgs(
                name="auth",
                secret=core.SecretVolumeSourceArgs(
                    secret_name=secret,
                    items=[core.KeyToPathArgs(key=PASSWORDS_KEY, path=PASSWORDS_KEY)],
                    # Owner root, group fsGroup (squid's): readable by squid only.
                    default_mode=0o440,
                ),
            )
        )
    return volumes


def deployment_spec(
    request: ProxyRequest,
    k8s_config: KubernetesProvider,
    labels: dict[str, str],
    squid_conf: str,
    config_map: str,
    secret: str | None,
) -> k8s.apps.v1.DeploymentSpecArgs:
    conf_digest = hashlib.sha256(squid_conf.encode()).hexdigest()
    zone = request.replica.entry.placement.zone
    return k8s.apps.v1.DeploymentSpecArgs(
        # One pod per proxy: each replica has its own credentials and Service.
        replicas=1,
        selector=meta.LabelSelectorArgs(match_labels=selector(request)),
        template=core.PodTemplateSpecArgs(
            metadata=meta.ObjectMetaArgs(
                labels=labels,
                # squid reads its config at start only: a changed ConfigMap
                # rolls the pod through this annotation. (The password file is
                # re-read by squid's helper when the Secret volume updates.)
                annotations={CONFIG_HASH_ANNOTATION: conf_digest},
            ),
            spec=core.PodSpecArgs(
                containers=[_container(request, k8s_config)],
                volumes=_volumes(request, config_map, secret),
                # squid needs no Kubernetes API; a token would only be a target.
                automount_service_account_token=False,
                enable_service_links=False,
                security_context=pod_security(SQUID_UID),
                node_selector={"topology.kubernetes.io/zone": zone} if zone else None,
                # Proxies on different nodes egress from different addresses.
                affinity=core.AffinityArgs(
                    pod_anti_affinity=core.PodAntiAffinityArgs(
                        preferred_during_scheduling_ignored_during_execution=[
                            core.WeightedPodAffinityTermArgs(
                                weight=100,
                                pod_affinity_term=core.PodAffinityTermArgs(
                                    label_selector=meta.LabelSelectorArgs(
                                        match_labels=stack_selector(request)
                                    ),
                                    topology_key="kubernetes.io/hostname",
                                ),
                            )
                        ]
                    )
                ),
                # squid's shutdown_lifetime is 5 s.
                termination_grace_period_seconds=15,
            ),
        ),
    )
