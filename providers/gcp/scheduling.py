"""How GCP provisions a proxy's VM: the instance's `scheduling` block.

Spot VMs cost a fraction of standard ones and a proxy loses nothing it
cannot get back when one is preempted: no state lives on it, squid's files
come from the metadata, the discovery service stops handing it out once its
probes fail, and crawlers rotate. A preempted Spot VM is deleted, not
stopped: the stack then sees it gone (`pulumi refresh`) and `pulumi up`
makes it again, with a new ephemeral address. A stopped one would stay in
the state as it was, and nothing in the stack would start it again.

A VM's provisioning model changes only with a new VM (pulumi-gcp replaces
the instance: `provisioningModel` and `preemptible` force a new one). A block
left out keeps what the VM has, so leaving Spot takes `standard`, said
explicitly; and with no key at all the instance has no block, as before the
key existed (no change to existing stacks).
"""

from __future__ import annotations

import pulumi_gcp as gcp

from providers.gcp.config import Provisioning


def scheduling(provisioning: Provisioning | None) -> gcp.compute.InstanceSchedulingArgs | None:
    """The instance's scheduling block for the provider entry's `provisioning`."""
    if provisioning is None:
        return None
    if provisioning == "standard":
        return gcp.compute.InstanceSchedulingArgs(provisioning_model="STANDARD", preemptible=False)
    # What GCP requires of a Spot VM (no automatic restart, terminated on host
    # maintenance), and deleted when preempted (above).
    return gcp.compute.InstanceSchedulingArgs(
        provisioning_model="SPOT",
        preemptible=True,
        automatic_restart=False,
        on_host_maintenance="TERMINATE",
        instance_termination_action="DELETE",
    )
