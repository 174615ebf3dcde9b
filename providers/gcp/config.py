"""The gcp provider entry (``type: gcp``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from proxyinfra.config import Model, ProviderEntry

GCP_IMAGE_PATTERN = r"^projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/global/images/(family/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A public (or own) image: ``projects/P/global/images/family/F`` or ``.../images/NAME``."""

# Images from these projects ship cloud-init (reading the `user-data` metadata
# key); Debian's and most others only have Google's guest agent, which runs a
# `startup-script`.
CLOUD_INIT_IMAGE_PROJECTS = ("ubuntu-os-cloud", "ubuntu-os-pro-cloud")

Bootstrap = Literal["cloud-init", "startup-script"]
# How GCP provisions the VMs (providers/gcp/scheduling.py); None leaves it to GCP.
Provisioning = Literal["standard", "spot"]


def _image_shorthand(value: object) -> object:
    # `images: {debian-12: projects/...}` is short for `{image: projects/...}`.
    return {"image": value} if isinstance(value, str) else value


class GcpImage(Model):
    image: Annotated[str, Field(pattern=GCP_IMAGE_PATTERN)]
    # None: cloud-init for the projects in CLOUD_INIT_IMAGE_PROJECTS, else a startup script.
    bootstrap: Bootstrap | None = None

    @property
    def bootstrap_method(self) -> Bootstrap:
        return self.bootstrap or image_bootstrap(self.image)


def image_bootstrap(image: str) -> Bootstrap:
    """How squid gets onto a VM booted from this image path."""
    project = image.split("/")[1] if image.startswith("projects/") else ""
    return "cloud-init" if project in CLOUD_INIT_IMAGE_PROJECTS else "startup-script"


GCP_PROJECT_PATTERN = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
GCP_REGION_PATTERN = r"^[a-z]+-[a-z]+[0-9]+$"


class GcpProvider(Model):
    project: Annotated[str, Field(pattern=GCP_PROJECT_PATTERN)]
    region: Annotated[str, Field(pattern=GCP_REGION_PATTERN)]
    zones: list[str] = Field(default_factory=list)
    network: Annotated[str, Field(min_length=1)] = "default"
    subnetwork: str | None = None
    machine_types: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: ["e2-micro", "e2-small"]
    )
    images: dict[str, Annotated[GcpImage, BeforeValidator(_image_shorthand)]] = Field(
        default_factory=lambda: {
            "debian-12": GcpImage(image="projects/debian-cloud/global/images/family/debian-12")
        }
    )
    boot_disk_size_gb: Annotated[int, Field(ge=10, le=65536)] = 10
    static_ip: bool = False
    provisioning: Provisioning | None = None


class GcpProviderEntry(ProviderEntry):
    type: Literal["gcp"]
    gcp: GcpProvider
