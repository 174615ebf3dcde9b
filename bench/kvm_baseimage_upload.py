"""Benchmark: a BaseImage create of a 1 GiB image against a plain SSH copy.

Run: scripts/bench kvm_baseimage_upload   (or .venv/bin/python -m bench.kvm_baseimage_upload)

A random 1 GiB file is served by a local HTTP server and created as a
BaseImage through the provider process (`python -m pulumi.dynamic`, driven
over gRPC like the engine does) on the testbed: HTTP download, sha256 and
libvirt volume upload through OpenSSH's forward, all streamed. In the same run
the same file is copied with OpenSSH to the same host (`cat > /dev/null`) as
the baseline; as references, the file is fetched over HTTP alone (no upload)
and uploaded by libvirt alone through the same forward (no HTTP): the
create can be no faster than the slower of the two. Also printed: the
provider process's peak RSS (VmHWM) before and after the upload, and the
libvirt RPCs per Create (fresh and cached) and per Read, counted from the
debug trace.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from providers.kvm.access import HostAccess
from providers.kvm.baseimage import BaseImageArgs, BaseImageProvider
from providers.kvm.config import KvmProviderEntry
from providers.kvm.connection import HostConnection
from providers.kvm.download import download
from providers.kvm.volumes import upload, volume_xml
from tests.harness.engine import ProviderProcess, make_urn, provider_inputs
from tests.support.http import FileServer
from tests.support.testbed import Testbed, load_testbed, run_testbed

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
URN = make_urn("bench-image")


def random_file(path: Path, size: int) -> str:
    """Random bytes (nothing compresses them on the way); returns the sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = os.urandom(min(4 * MIB, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def ssh_copy(testbed: Testbed, path: Path) -> None:
    argv = [*testbed.ssh_argv(), "cat > /dev/null"]
    with path.open("rb") as source:
        subprocess.run(argv, stdin=source, check=True, timeout=1800)


def http_only(url: str) -> None:
    """Download and hash the way a create does (download.py), no upload:
    what the HTTP side alone costs."""
    digest = hashlib.sha256()
    with download(url) as response:
        while chunk := response.read(MIB, decode_content=False):
            digest.update(chunk)


def libvirt_only(access: HostAccess, path: Path, size: int) -> float:
    """Seconds to upload the file into a fresh raw volume through the forward
    a create uses (HostConnection.bulk: OpenSSH's)."""
    connection = HostConnection(access)
    try:
        name = f"bench-baseimage-{uuid.uuid4().hex[:8]}.raw"
        with connection.bulk() as conn:
            pool = conn.storagePoolLookupByName(access.pool)
            vol = pool.createXML(volume_xml(name, size, "raw"), 0)
            try:
                with path.open("rb") as source:
                    return timed(
                        lambda: upload(conn, vol, iter(lambda: source.read(MIB), b""), size)
                    )
            finally:
                vol.delete(0)
    finally:
        connection.close()


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1)) / 1024


class Rpcs:
    """libvirt RPCs the provider traced from now on."""

    def __init__(self, engine: ProviderProcess) -> None:
        self.engine = engine
        self.start = len(engine.log_text())

    def names(self) -> list[str]:
        return re.findall(r" kvm\.libvirt (vir\w+)", self.engine.log_text()[self.start :])


def access_of(testbed: Testbed) -> HostAccess:
    entry = KvmProviderEntry.model_validate(yaml.safe_load(testbed.provider_yaml.read_text()))
    return HostAccess.of(entry, entry.kvm.hosts[0], ROOT)


def inputs(access: HostAccess, url: str, digest: str) -> dict[str, Any]:
    props = BaseImageArgs.of(access, url, digest, "raw", keep=False).to_props()
    return provider_inputs(BaseImageProvider(), props)


def rate(size: int, seconds: float) -> float:
    return size / MIB / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=2, help="fresh creates (and SSH copies)")
    args = parser.parse_args()
    if run_testbed("up").returncode != 0:
        raise SystemExit("scripts/testbed up failed")
    testbed = load_testbed()
    access = access_of(testbed)
    size = args.mib * MIB
    with tempfile.TemporaryDirectory(prefix="bench-baseimage-", dir="/var/tmp") as tmp:
        image = Path(tmp) / "image.raw"
        digest = random_file(image, size)
        with (
            FileServer() as server,
            ProviderProcess(env={"EGRESS_PROXIES_LOG": "debug"}, rpc_timeout=1800) as engine,
        ):
            url = server.add(f"/bench-{digest[:8]}/image.raw", file=image)
            props = inputs(access, url, digest)
            assert engine.pid is not None
            rpcs = Rpcs(engine)
            assert engine.read(props["volume"], URN, props).id == ""  # imports, connects
            gone_rpcs = rpcs.names()
            rss_before = peak_rss_mib(engine.pid)

            ssh_s, fresh_s, http_s, libvirt_s = [], [], [], []
            outs: dict[str, Any] = {}
            for _ in range(args.runs):
                ssh_s.append(timed(lambda: ssh_copy(testbed, image)))
                http_s.append(timed(lambda: http_only(url)))
                libvirt_s.append(libvirt_only(access, image, size))
                rpcs = Rpcs(engine)
                fresh_s.append(timed(lambda: outs.update(engine.create(URN, props).properties)))
                fresh_rpcs = rpcs.names()
                assert outs["digest"] == digest and not outs["cached"]
                if len(fresh_s) < args.runs:
                    engine.delete(props["volume"], URN, outs)
            rss_after = peak_rss_mib(engine.pid)

            rpcs = Rpcs(engine)
            cached_s = timed(lambda: outs.update(engine.create(URN, props).properties))
            cached_rpcs = rpcs.names()
            assert outs["cached"]
            rpcs = Rpcs(engine)
            engine.read(props["volume"], URN, outs)
            read_rpcs = rpcs.names()
            rpcs = Rpcs(engine)
            engine.delete(props["volume"], URN, outs)
            delete_rpcs = rpcs.names()
            assert server.count(f"/bench-{digest[:8]}/image.raw") == 2 * args.runs

    ssh_rate = rate(size, statistics.median(ssh_s))
    http_rate = rate(size, statistics.median(http_s))
    best = rate(size, min(fresh_s))
    median = rate(size, statistics.median(fresh_s))
    print(f"BaseImage create of a {args.mib} MiB raw image ({args.runs} runs each, same run)")
    print(f"  plain SSH copy (OpenSSH, cat > /dev/null)  {ssh_rate:7.1f} MiB/s   (baseline)")
    print(
        f"  BaseImage create (fetch+sha256+upload)     {median:7.1f} MiB/s   "
        f"ratio {median / ssh_rate:4.2f} of SSH (best run {best:.1f} MiB/s, "
        f"{min(fresh_s):.1f} s)"
    )
    print(
        f"  HTTP fetch+sha256 alone (reference)        {http_rate:7.1f} MiB/s   "
        f"ratio {http_rate / ssh_rate:4.2f} of SSH"
    )
    libvirt_rate = rate(size, statistics.median(libvirt_s))
    print(
        f"  libvirt upload alone (same forward)        {libvirt_rate:7.1f} MiB/s   "
        f"ratio {libvirt_rate / ssh_rate:4.2f} of SSH"
    )
    print(f"  cached create                              {cached_s * 1000:7.1f} ms")
    print("provider process peak RSS (VmHWM)")
    print(f"  connected, before any upload   {rss_before:6.1f} MiB   (baseline)")
    print(
        f"  after {args.runs} x {args.mib} MiB uploads    {rss_after:6.1f} MiB   "
        f"ratio {rss_after / rss_before:4.2f} (+{rss_after - rss_before:.1f} MiB)"
    )
    print("libvirt RPCs (debug trace lines)")
    for label, names in (
        ("Create, fresh", fresh_rpcs),
        ("Create, cached", cached_rpcs),
        ("Read", read_rpcs),
        ("Read, gone", gone_rpcs),
        ("Delete", delete_rpcs),
    ):
        print(f"  {label:15} {len(names):3}  {' '.join(names)}")


if __name__ == "__main__":
    main()
