"""What a libvirt host has free for a proxy, and what one proxy takes of it.

The one rule that ``ProxyDomain`` and ``Overlay`` check before they create
anything (memory: what the host has free or in its page cache; disk: the pool's
``available`` as libvirt holds it, the overlay counted at its virtual size)
and that the autopilot reads ahead of a scale-up (providers/kvm/room.py): one
rule, so that the planner never counts room a create would then refuse. A
leaf module (no other module of the backend), so that volumes.py, domain.py
and overlay.py can all import it.
"""

from __future__ import annotations

from typing import Any

import libvirt

MIB = 1024**2
GIB = 1024**3
MEMORY = "memory"  # the resources, as the autopilot's Room names them
DISK = "disk"


# The node memory stats (KiB) a new guest can take: free, and the buffers and
# page cache the kernel gives back under pressure.
_RECLAIMABLE = ("free", "buffers", "cached")


def free_memory(conn: Any) -> int:
    """Bytes of memory a new guest can have on the host: free memory plus the
    buffers and page cache (libvirt's virNodeGetMemoryStats: /proc/meminfo's
    MemFree + Buffers + Cached on Linux, the sum OpenStack's scheduler uses).

    Not MemFree alone (virNodeGetFreeMemory): a host that has run for a while
    keeps most of its idle memory as page cache, which the kernel drops for a
    new guest; counted as used, it refused a 512 MiB domain on a host with
    gigabytes to spare ("411.3 MiB of memory free", measured on the testbed
    while the test suite had filled the cache). A driver without node stats
    (libvirt's test driver) gets its free memory."""
    try:
        stats = conn.getMemoryStats(libvirt.VIR_NODE_MEMORY_STATS_ALL_CELLS)
    except libvirt.libvirtError as error:
        if error.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
            raise
        return int(conn.getFreeMemory())
    return sum(int(stats.get(key, 0)) for key in _RECLAIMABLE) * 1024


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
