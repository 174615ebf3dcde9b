"""Benchmark: libvirt over the SSH forward against the direct local socket.

Run: scripts/bench kvm_transport   (brings the testbed up first)
Prints RPC latency and volume upload throughput for both paths, measured in
the same run, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import libvirt
import yaml

from providers.kvm.access import HostAccess
from providers.kvm.config import KvmProviderEntry
from providers.kvm.connection import HostConnection

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 4 * 1024 * 1024


def rpc_latency_ms(conn: Any, pool: str, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        conn.storagePoolLookupByName(pool)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def upload_mib_s(conn: Any, pool_name: str, size: int) -> float:
    pool = conn.storagePoolLookupByName(pool_name)
    name = f"bench-{uuid.uuid4().hex[:8]}.raw"
    vol = pool.createXML(
        f"<volume><name>{name}</name><capacity>{size}</capacity><target><format type='raw'/></target></volume>",
        0,
    )
    block = os.urandom(CHUNK)
    try:
        start = time.perf_counter()
        stream = conn.newStream(0)
        vol.upload(stream, 0, size, 0)
        sent = 0
        while sent < size:
            stream.send(block[: min(CHUNK, size - sent)])
            sent += CHUNK
        stream.finish()
        return size / (1024 * 1024) / (time.perf_counter() - start)
    finally:
        vol.delete(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=512)
    args = parser.parse_args()
    entry = KvmProviderEntry.model_validate(
        yaml.safe_load((ROOT / ".testbed" / "provider.yaml").read_text())
    )
    host = entry.kvm.hosts[0]
    access = HostAccess.of(entry, host, ROOT)
    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    direct = libvirt.open(f"qemu+unix:///system?socket={host.socket}")
    forwarded = HostConnection(access)
    ssh = forwarded.libvirt().raw
    size = args.mib * 1024 * 1024
    try:
        results = {}
        for label, conn in (("direct", direct), ("ssh", ssh)):
            rpc_latency_ms(conn, host.pool, 50)  # warm up
            results[label] = (
                rpc_latency_ms(conn, host.pool, args.calls),
                upload_mib_s(conn, host.pool, size),
            )
    finally:
        direct.close()
        forwarded.close()
    (d_rpc, d_up), (s_rpc, s_up) = results["direct"], results["ssh"]
    print(f"libvirt RPC median latency ({args.calls} x virStoragePoolLookupByName)")
    print(f"  direct socket   {d_rpc:8.3f} ms   (baseline)")
    print(f"  over SSH        {s_rpc:8.3f} ms   ratio {s_rpc / d_rpc:5.2f}x slower")
    print(f"volume upload ({args.mib} MiB, raw)")
    print(f"  direct socket   {d_up:8.1f} MiB/s (baseline)")
    print(f"  over SSH        {s_up:8.1f} MiB/s ratio {s_up / d_up:5.2f} of direct")


if __name__ == "__main__":
    main()
