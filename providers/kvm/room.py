"""The room of a kvm host, for the autopilot's planner (proxyinfra/autopilot/room.py).

A group's place is the host its replicas land on (``provider/host``, the
rule deploy.py places them by); one more replica needs its machine type's
memory and its overlay's virtual size, and the host has free what libvirt
says now: the rule ProxyDomain's and Overlay's creates check (capacity.py),
read through the same connection seam as the provider (connection.py: SSH,
or the simulated hosts the environment names, put in place by the provider
process's own start). The seed volume (a few KiB) is not counted; the base
image is already there for a group that has replicas on the host.
"""

from __future__ import annotations

from pathlib import Path

import libvirt
import paramiko

from providers.kvm.access import HostAccess
from providers.kvm.capacity import (
    DISK,
    MEMORY,
    domain_memory,
    free_memory,
    pool_available,
    size_bytes,
)
from providers.kvm.config import KvmProviderEntry
from providers.kvm.connection import source
from providers.kvm.deploy import host_of
from providers.kvm.errors import HostError, KvmError
from providers.kvm.resource import start
from providers.kvm.volumes import lookup_pool
from proxyinfra.backend import Place, RoomUnknown
from proxyinfra.config import ProxyEntry


def place(proxy: ProxyEntry, entry: KvmProviderEntry) -> Place:
    """PROXY's host and what one more of its replicas takes there."""
    host = host_of(entry, proxy.placement.zone)
    machine = entry.kvm.machine_types[proxy.placement.machine_type or ""]
    return Place(
        f"{entry.name}/{host.name}",
        {MEMORY: domain_memory(machine.memory_mib), DISK: size_bytes(entry.kvm.disk_size_gb)},
    )


def free(proxy: ProxyEntry, entry: KvmProviderEntry, base_dir: Path) -> dict[str, int]:
    """The free memory and pool space of PROXY's host, read now; RoomUnknown,
    naming the host, when it cannot be reached or answers with an error."""
    access = HostAccess.of(entry, host_of(entry, proxy.placement.zone), base_dir)
    start()  # as a provider process: log levels, and simulated hosts when the environment asks
    try:
        conn = source(access).libvirt()
        return {MEMORY: free_memory(conn), DISK: pool_available(lookup_pool(conn, access))}
    except HostError as error:  # its text names the host already
        raise RoomUnknown(str(error)) from error
    except libvirt.libvirtError as error:
        raise RoomUnknown(f"{access.where}: {error.get_error_message()}") from error
    except (KvmError, paramiko.SSHException, OSError) as error:
        raise RoomUnknown(f"{access.where}: {type(error).__name__}: {error}") from error
