"""A fleet split into two stacks, converged by the real CLI (`pulumi up` of
each, at the same time) and served by one discovery service (`--stack`
twice, running `pulumi stack output` itself): the union under names
qualified by stack, probed through real squids, leased from both; a change
to one stack reaches the service while the other's lease lives on.

The proxies are `external` (real squids on loopback): what is under test is
the stacks and the service over them, not the VMs (test_cli_fleet.py)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.discovery import ServiceProcess, free_port, proxies, wait_for
from tests.support.pulumi_cli import CliStack
from tests.support.squid import EchoServer, RunningSquid, loopback_settings, start_squid
from tests.support.stack_config import external_provider, proxy

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

TOKEN = "stacks-token-" + "5e6f7a8b9c0d" * 3
PASSWORD = "squid-pw-" + "st4cks-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def squids() -> Iterator[list[RunningSquid]]:
    settings = loopback_settings(auth_username="crawler")
    with (
        start_squid(settings, password=PASSWORD) as a,
        start_squid(settings, password=PASSWORD) as b,
    ):
        yield [a, b]


def config(site: str, ports: list[int]) -> dict[str, Any]:
    proxies = [
        proxy(
            f"edge-{i}",
            "corp",
            url=f"http://crawler:{PASSWORD}@127.0.0.1:{port}",
            labels={"site": site},
        )
        for i, port in enumerate(ports)
    ]
    return {"providers": [external_provider()], "proxies": proxies}  # no squid block


def healthy(client: httpx.Client, names: set[str]) -> bool:
    listed = proxies(client)
    return set(listed) == names and all(p["health"] == "healthy" for p in listed.values())


def test_two_stacks_up_at_once_are_served_by_one_service(
    tmp_path: Path, squids: list[RunningSquid]
) -> None:
    project = tmp_path / "project"
    a, b = squids
    stacks = [
        CliStack(project, "site-a", config("a", [a.port])),
        CliStack(project, "site-b", config("b", [b.port])),
    ]
    with ThreadPoolExecutor(2) as pool:  # independent stacks: converged in parallel
        list(pool.map(lambda s: s.ok("up", "--yes", "--skip-preview"), stacks))
    target = EchoServer()
    args = ["--stack", "site-a", "--stack", "site-b", "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-target", f"127.0.0.1:{target.port}"]
    args += ["--probe-interval", "0.5"]
    env = {**stacks[0].env(), "DISCOVERY_TOKEN": TOKEN, "DISCOVERY_STACK_REFRESH_SECONDS": "1"}
    service = ServiceProcess(args, log_path=tmp_path / "service.log", env=env, cwd=project)
    service.start(timeout=60)
    try:
        with httpx.Client(base_url=service.url, headers=AUTH, timeout=10) as client:
            names = {"site-a/edge-0", "site-b/edge-0"}
            wait_for(lambda: healthy(client, names), timeout=30, what="both stacks probed")
            leases = {}
            for site in ("a", "b"):
                answer = client.post(
                    "/v1/leases", json={"holder": "h", "selector": {"labels": {"site": site}}}
                )
                assert answer.status_code == 201, answer.text
                leases[site] = answer.json()
            assert leases["a"]["proxy"]["name"] == "site-a/edge-0"
            assert leases["b"]["proxy"]["url"].endswith(f"@127.0.0.1:{b.port}")

            # site-b grows by a proxy (the same squid again): only site-b's stack changes.
            stacks[1].write_config(config("b", [b.port, b.port]))
            stacks[1].ok("up", "--yes", "--skip-preview")
            names.add("site-b/edge-1")
            wait_for(lambda: healthy(client, names), timeout=30, what="site-b's new proxy")
            for lease in leases.values():
                assert client.post(f"/v1/leases/{lease['id']}/renew").status_code == 200
    finally:
        service.stop()
        target.close()
    assert PASSWORD not in (tmp_path / "service.log").read_text()
