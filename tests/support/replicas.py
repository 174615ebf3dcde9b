"""Discovery replicas on one PostgreSQL as the replica tests start them: a fleet
file of CONNECT responders' ports, and `python -m discovery serve` on it with a
short probe interval (tests/integration/test_discovery_replicas.py and the
test_discovery_pg_* modules)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.discovery import ServiceProcess, free_port, manifest, proxy_entry

INTERVAL = "0.5"


def write(path: Path, ports: list[int], names: list[str] | None = None) -> None:
    names = names or [f"p{i}" for i in range(len(ports))]
    entries = [
        proxy_entry(n, port=p, labels={"slot": n}) for n, p in zip(names, ports, strict=True)
    ]
    path.write_text(json.dumps(manifest(entries)))


def replica(cluster_url: str, fleet: Path, log: Path) -> ServiceProcess:
    args = ["--fleet", str(fleet), "--db", cluster_url, "--listen", f"127.0.0.1:{free_port()}"]
    args += [
        "--probe-target",
        "127.0.0.1:9",
        "--probe-interval",
        INTERVAL,
        "--lease-cooldown",
        "60",
    ]
    return ServiceProcess(args, log_path=log)
