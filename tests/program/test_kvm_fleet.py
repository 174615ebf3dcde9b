"""The stack program in hybrid mode: a two-proxy kvm fleet really brought up on
the testbed (image download, overlays, seeds, VMs booting to a DHCP lease),
exported, and torn down again."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import libvirt
import pytest
import yaml

from proxyinfra.manifest import load_schema
from proxyinfra.names import overlay_volume, proxy_id, seed_volume
from tests.harness.program import run_program
from tests.support.http import FileServer
from tests.support.images import tiny_image
from tests.support.testbed import Testbed

pytestmark = pytest.mark.integration
DYNAMIC = "pulumi-python:dynamic:Resource"


def fleet_config(testbed: Testbed, image_url: str) -> dict[str, Any]:
    provider = yaml.safe_load(testbed.provider_yaml.read_text())
    provider["kvm"]["images"] = {"tiny": {"url": image_url}}
    provider["kvm"]["machineTypes"] = {"small": {"cpus": 1, "memoryMb": 256}}
    provider["kvm"]["ipTimeoutSeconds"] = 180
    return {
        "providers": [provider],
        "proxies": [
            {
                "name": "home",
                "provider": "testbed",
                "replicas": 2,
                "placement": {"machineType": "small", "image": "tiny"},
                "labels": {"site": "testbed"},
            }
        ],
        "squid": {"allowedClients": [str(testbed.subnet)], "auth": {"username": "crawler"}},
    }


def test_two_proxy_fleet_up_exported_and_torn_down(testbed: Testbed, tmp_path: Path) -> None:
    stack = f"fleet{uuid.uuid4().hex[:6]}"
    image = tiny_image()
    conn = libvirt.open("qemu:///system")
    try:
        with FileServer() as server:
            url = server.add(f"/{stack}/tiny.qcow2", file=image)
            result = run_program(
                "proxyinfra.program:main",
                fleet_config(testbed, url),
                stack=stack,
                hybrid=True,
                mode="up-destroy",
                state_file=tmp_path / "state.json",
                timeout=900,
            )
            assert server.count(f"/{stack}/tiny.qcow2") == 1  # one base for both proxies
        result.raise_for_error()
        assert result.destroy_error is None
        fleet = result.output("fleet")
        jsonschema.validate(fleet, load_schema())
        ips = [p["host"] for p in fleet["proxies"]]
        assert [p["name"] for p in fleet["proxies"]] == ["home-0", "home-1"]
        assert all(re.fullmatch(r"10\.251\.77\.\d+", ip) for ip in ips) and len(set(ips)) == 2
        assert all(p["zone"] == "testbed" and p["type"] == "kvm" for p in fleet["proxies"])
        assert all(p["auth"]["username"] == "crawler" for p in fleet["proxies"])
        assert result.is_secret("fleet")

        kinds = sorted(r.name.rsplit("-", 1)[-1] for r in result.resources_of_type(DYNAMIC))
        assert (
            kinds.count("domain") == 2 and kinds.count("overlay") == 2 and kinds.count("seed") == 2
        )
        assert kinds.count("credentials") == 2 and len(kinds) == 9  # + one base image
        # The seeds' user-data is a secret in the recorded inputs.
        seeds = [r for r in result.resources_of_type(DYNAMIC) if r.name.endswith("-seed")]
        assert all("userData" in s.secret_inputs for s in seeds)
        # Torn down in reverse: nothing of the proxies is left on the host.
        assert result.deleted == list(reversed(result.created))
        ids = [proxy_id("egress-proxies", stack, n) for n in ("home-0", "home-1")]
        assert not set(ids) & {d.name() for d in conn.listAllDomains(0)}
        pool = conn.storagePoolLookupByName(testbed.pool)
        pool.refresh(0)
        left = {v.name() for v in pool.listAllVolumes(0)}
        for pid in ids:
            assert overlay_volume(pid) not in left and seed_volume(pid) not in left
    finally:
        conn.close()
