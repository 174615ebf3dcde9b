"""Proxies as Kubernetes pods (pulumi-kubernetes): see docs/kubernetes-provider.md."""

from providers.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
