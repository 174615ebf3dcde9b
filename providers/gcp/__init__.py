"""Proxies as GCP Compute VMs (pulumi-gcp): see docs/gcp-provider.md."""

from providers.gcp.backend import GcpBackend

__all__ = ["GcpBackend"]
