"""A fleet of the tiny test image on the testbed, for the tests and
benchmarks that run `pulumi up` through the real CLI, and what they look
at on the host."""

from __future__ import annotations

from typing import Any

import libvirt

from tests.support.stack_config import (
    image,
    machine_type,
    placement,
    proxy,
    squid,
    stack_config,
    the_testbed_provider,
)
from tests.support.testbed import URI, Testbed, refresh_pool


def tiny_fleet(
    testbed: Testbed, url: str, *, name: str = "solo", replicas: int = 1, ip_timeout: int = 180
) -> dict[str, Any]:
    """Stack config: `replicas` VMs of the image at `url` (its own base) on the testbed."""
    provider = the_testbed_provider(
        testbed,
        images={"tiny": image(url)},
        machine_types={"small": machine_type(1, 256)},
        ip_timeout=ip_timeout,
    )
    where = placement("small", "tiny")
    return stack_config(
        [provider],
        [proxy(name, provider["name"], replicas=replicas, where=where)],
        squid(str(testbed.subnet)),
    )


def pool_volumes(testbed: Testbed) -> set[str]:
    """The names of the volumes in the testbed's pool right now."""
    conn = libvirt.open(URI)
    try:
        pool = conn.storagePoolLookupByName(testbed.pool)
        refresh_pool(pool)
        return {v.name() for v in pool.listAllVolumes(0)}
    finally:
        conn.close()
