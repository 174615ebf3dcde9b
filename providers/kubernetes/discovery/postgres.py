"""The single PostgreSQL pod a stack may run for its discovery service
(discovery.database.postgres): a Secret with the generated password and the
URL the service connects with, a PVC, a Deployment of one pod (Recreate: two
servers must never open one data directory), a ClusterIP Service and a
NetworkPolicy that admits the service's pods only. No failover, no backups:
for small setups (docs/discovery.md, "On Kubernetes").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from providers.kubernetes.discovery.names import (
    PASSWORD_KEY,
    POSTGRES_DB,
    POSTGRES_PORT,
    POSTGRES_UID,
    POSTGRES_USER,
    URL_KEY,
    selector,
)
from providers.kubernetes.discovery.network import database_policy_spec
from providers.kubernetes.restricted import container_security, pod_security
from proxyinfra.backend import DiscoveryRequest

core = k8s.core.v1
meta = k8s.meta.v1
apps = k8s.apps.v1

DATA_DIR = "/var/lib/postgresql/data"
SKIP_AWAIT = "pulumi.com/skipAwait"
PASSWORD_DIR = "/etc/egress-postgres"


@dataclass(frozen=True)
class StackDatabase:
    secret: str  # holds URL_KEY, the service's connection URL with the password
    ready: list[pulumi.Resource]  # what the service's pods wait for


def _container(image: str) -> core.ContainerArgs:
    ready = core.ProbeArgs(
        exec_=core.ExecActionArgs(
            command=["pg_isready", "-h", "127.0.0.1", "-U", POSTGRES_USER, "-d", POSTGRES_DB]
        ),
        period_seconds=2,
        timeout_seconds=3,
        failure_threshold=3,
    )
    return core.ContainerArgs(
        name="postgres",
        image=image,
        image_pull_policy="IfNotPresent",
        env=[
            core.EnvVarArgs(name="PGDATA", value=f"{DATA_DIR}/pgdata"),
            core.EnvVarArgs(name="POSTGRES_USER", value=POSTGRES_USER),
            core.EnvVarArgs(name="POSTGRES_PASSWORD_FILE", value=f"{PASSWORD_DIR}/{PASSWORD_KEY}"),
        ],
        ports=[core.ContainerPortArgs(name="postgres", container_port=POSTGRES_PORT)],
        readiness_probe=ready,
        liveness_probe=core.ProbeArgs(
            tcp_socket=core.TCPSocketActionArgs(port="postgres"),
            initial_delay_seconds=30,
            period_seconds=10,
        ),
        security_context=container_security(),
        volume_mounts=[
            core.VolumeMountArgs(name="data", mount_path=DATA_DIR),
            core.VolumeMountArgs(name="password", mount_path=PASSWORD_DIR, read_only=True),
            core.VolumeMountArgs(name="run", mount_path="/tmp"),
        ],
    )


def deploy_database(
    request: DiscoveryRequest,
    base: str,
    metadata: Callable[[str, str], meta.ObjectMetaArgs],
    opts: pulumi.ResourceOptions,
    host_of: Callable[[core.Service], pulumi.Output[str]],
) -> StackDatabase:
    postgres = request.config.database.postgres
    password = request.database_password
    assert postgres is not None and password is not None
    name = f"{base}-postgres"
    policy = k8s.networking.v1.NetworkPolicy(
        "discovery-database-network-policy",
        metadata=metadata(name, "database"),
        spec=database_policy_spec(request),
        opts=opts,
    )
    service = core.Service(
        "discovery-database-service",
        metadata=metadata(name, "database"),
        spec=core.ServiceSpecArgs(
            type="ClusterIP",
            selector=selector(request, "database"),
            ports=[
                core.ServicePortArgs(name="postgres", port=POSTGRES_PORT, target_port="postgres")
            ],
        ),
        opts=opts,
    )
    host = host_of(service)
    url = pulumi.Output.all(host, password).apply(
        lambda hp: f"postgresql://{POSTGRES_USER}:{hp[1]}@{hp[0]}:{POSTGRES_PORT}/{POSTGRES_DB}"
    )
    data: pulumi.Output[dict[str, str]] = pulumi.Output.secret(
        pulumi.Output.all(password, url).apply(lambda pu: {PASSWORD_KEY: pu[0], URL_KEY: pu[1]})
    )
    secret = core.Secret(
        "discovery-database-secret",
        metadata=metadata(name, "database"),
        type="Opaque",
        string_data=data,
        opts=opts,
    )
    claim_meta = metadata(name, "database")
    claim = core.PersistentVolumeClaim(
        "discovery-database-volume",
        metadata=meta.ObjectMetaArgs(
            name=claim_meta.name,
            namespace=claim_meta.namespace,
            labels=claim_meta.labels,
            # A claim of a WaitForFirstConsumer class binds only once its pod
            # is scheduled, and the pod waits for the claim: the Deployment's
            # await stands for both.
            annotations={SKIP_AWAIT: "true"},
        ),
        spec=core.PersistentVolumeClaimSpecArgs(
            access_modes=["ReadWriteOnce"],
            storage_class_name=postgres.storage_class,
            resources=core.VolumeResourceRequirementsArgs(requests={"storage": postgres.storage}),
        ),
        opts=opts,
    )
    deployment = apps.Deployment(
        "discovery-database",
        metadata=metadata(name, "database"),
        spec=apps.DeploymentSpecArgs(
            replicas=1,
            selector=meta.LabelSelectorArgs(match_labels=selector(request, "database")),
            strategy=apps.DeploymentStrategyArgs(type="Recreate"),
            template=core.PodTemplateSpecArgs(
                metadata=meta.ObjectMetaArgs(labels=metadata(name, "database").labels),
                spec=core.PodSpecArgs(
                    automount_service_account_token=False,
                    enable_service_links=False,
                    containers=[_container(postgres.image)],
                    volumes=[
                        core.VolumeArgs(
                            name="data",
                            persistent_volume_claim=core.PersistentVolumeClaimVolumeSourceArgs(
                                claim_name=name
                            ),
                        ),
                        core.VolumeArgs(
                            name="password",
                            secret=core.SecretVolumeSourceArgs(
                                secret_name=name,
                                items=[core.KeyToPathArgs(key=PASSWORD_KEY, path=PASSWORD_KEY)],
                                default_mode=0o440,
                            ),
                        ),
                        core.VolumeArgs(
                            name="run",
                            empty_dir=core.EmptyDirVolumeSourceArgs(
                                medium="Memory", size_limit="16Mi"
                            ),
                        ),
                    ],
                    security_context=pod_security(POSTGRES_UID),
                    # postgres's fast shutdown on SIGTERM's second half.
                    termination_grace_period_seconds=30,
                ),
            ),
        ),
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(depends_on=[policy, secret, claim])
        ),
    )
    return StackDatabase(secret=name, ready=[deployment, secret, service])
