"""The fleet's dispatch to backends, with credentials really generated (hybrid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bcrypt
import jsonschema

from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.manifest import load_schema
from proxyinfra.names import proxy_id
from tests.harness.program import run_program
from tests.support.stack_config import (
    external_provider,
    placement,
    proxy,
    squid,
    stack_config,
    unreachable_kvm_provider,
)

PROGRAM = "tests.program.fake_fleet:main"


def config(directory: Path, auth: bool) -> dict[str, Any]:
    home = proxy("home", "home", replicas=2, where=placement(), labels={"site": "home"})
    corp = proxy("corp-1", "corp", url="http://10.0.0.5:3128")
    return stack_config(
        [unreachable_kvm_provider(directory), external_provider()],
        [home, corp],
        squid(port=3129, username="crawler" if auth else None),
    )


def test_each_replica_is_a_component_dispatched_to_its_backend(tmp_path: Path) -> None:
    result = run_program(PROGRAM, config(tmp_path, auth=False))
    result.raise_for_error()
    components = result.resources_of_type(PROXY_TYPE)
    assert [c.name for c in components] == ["home-0", "home-1", "corp-1"]
    # Registration order across replicas is the SDK's concurrency, not ours.
    machines = {m.inputs["replica"]: m for m in result.resources_of_type("test:backend:Machine")}
    assert sorted(machines) == ["home-0", "home-1"]
    assert [machines[c.name].parent for c in components[:2]] == [c.urn for c in components[:2]]
    assert result.resources_of_type("pulumi-python:dynamic:Resource") == []  # no auth, no creds
    fleet = result.output("fleet")
    jsonschema.validate(fleet, load_schema())
    home0 = fleet["proxies"][0]
    pid = proxy_id("egress-proxies", "dev", "home-0")
    assert home0 == {
        "name": "home-0",
        "id": pid,
        "provider": "home",
        "type": "kvm",
        "zone": None,
        "host": f"{pid}-id.invalid",
        "port": 3129,
        "labels": {"site": "home"},
    }


def test_auth_generates_secret_credentials_per_proxy(tmp_path: Path) -> None:
    result = run_program(
        PROGRAM,
        config(tmp_path, auth=True),
        hybrid=True,
        mode="up-destroy",
        state_file=tmp_path / "state.json",
    )
    result.raise_for_error()
    creds = result.resources_of_type("pulumi-python:dynamic:Resource")
    assert sorted(c.name for c in creds) == ["home-0-credentials", "home-1-credentials"]
    assert all(
        "password" in c.secret_outputs and "password_hash" in c.secret_outputs for c in creds
    )
    fleet = result.output("fleet")
    assert result.is_secret("fleet")
    auths = [p.get("auth") for p in fleet["proxies"]]
    assert auths[2] is None  # the external proxy has no credentials in its URL
    assert auths[0]["username"] == "crawler" and auths[0]["password"] != auths[1]["password"]
    machines = {m.inputs["replica"]: m for m in result.resources_of_type("test:backend:Machine")}
    for auth, machine in zip(auths, (machines["home-0"], machines["home-1"]), strict=False):
        # The backend got the hash of exactly the password the manifest carries, as a secret.
        assert bcrypt.checkpw(auth["password"].encode(), machine.inputs["passwordHash"].encode())
        assert "passwordHash" in machine.secret_inputs
    assert [d for d in result.deleted] == list(reversed(result.created))
