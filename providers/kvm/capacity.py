"""What a libvirt host has free for a proxy, and what one proxy takes of it.

The one rule that ``ProxyDomain`` and ``Overlay`` check before they create
anything (memory: libvirt's free memory of the host; disk: the pool's
``available`` as libvirt holds it, the overlay counted at its virtual size)
and that the autopilot reads ahead of a scale-up (providers/kvm/room.py): one
rule, so that the planner never counts room a create would then refuse. A
leaf module (no other module of the backend), so that volumes.py, domain.py
and overlay.py can all import it.
"""

from __future__ import annotations

from typing import Any

MIB = 1024**2
GIB = 1024**3
MEMORY = "memory"  # the resources, as the autopilot's Room names them
DISK = "disk"


def free_memory(conn: Any) -> int:
    """Bytes of memory free on the host (libvirt's virNodeGetFreeMemory)."""
    return int(conn.getFreeMemory())


def pool_available(pool: Any) -> int:
    """Bytes the pool can still take, as libvirt last counted them (no
    refresh: what the create checks see)."""
    _state, _capacity, _allocation, available = pool.info()
    return int(available)


def domain_memory(memory_mib: Any) -> int:
    """A domain's memory in bytes, from its machine type's ``memoryMiB``
    (numbers cross the engine as floats)."""
    return int(memory_mib) * MIB


def size_bytes(size_gb: Any) -> int:
    """An overlay's ``sizeGb`` in bytes: what its pool must be able to hold
    (thin, it grows to that)."""
    return int(size_gb) * GIB
