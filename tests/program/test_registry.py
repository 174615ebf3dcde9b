"""A backend is one package plus one line in proxyinfra/registry.py: a fifth
backend written here (its model, checks and deployer) is validated, deployed
and listed in the manifest with no other file of the project touched."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.harness.program import run_program
from tests.support.stack_config import placement, proxy, stack_config

FAKE_BACKEND = """
from __future__ import annotations

import builtins
from typing import Literal

import pulumi

from proxyinfra.backend import Backend, Endpoint
from proxyinfra.config import Model, ProviderEntry


class FakeBlock(Model):
    region: str


class FakeEntry(ProviderEntry):
    type: Literal["fakecloud"]
    fakecloud: FakeBlock


class FakeDeployer:
    def deploy(self, request, parent):
        made = pulumi.CustomResource(
            "fakecloud:index:Vm", request.id, {"replica": request.replica.name},
            pulumi.ResourceOptions(parent=parent),
        )
        host = made.id.apply(lambda i: f"{i}.fake.invalid")
        return Endpoint.of(request, host, request.replica.provider.fakecloud.region)


class FakeBackend:
    type = "fakecloud"
    entry_model: builtins.type[ProviderEntry] = FakeEntry
    provisions = True
    takes_user_data = False
    rolls = False
    adopts_leftovers = False
    plugin = None
    pattern_words = {}

    def check_provider(self, entry, path, report):
        if entry.fakecloud.region == "nowhere":
            report.add(f"{path}.fakecloud.region", "no such region 'nowhere'")

    def check_proxy(self, proxy, entry, raw, path, report):
        if proxy.placement.zone is not None:
            report.add(f"{path}.placement.zone", "fakecloud has no zones")

    def check_access(self, entry, base_dir):
        return None

    def deployer(self, base_dir):
        return FakeDeployer()

    def add_commands(self, commands):
        pass


BACKEND: Backend = FakeBackend()
"""

# The one change outside the backend's own package: its name in the registry.
PROGRAM = """
from proxyinfra import program, registry

def main():
    registry.MODULES = (*registry.MODULES, "fakecloud")
    return program.main()
"""


@pytest.fixture
def fake_package(tmp_path: Path) -> Path:
    (tmp_path / "fakecloud").mkdir()
    (tmp_path / "fakecloud" / "__init__.py").write_text(textwrap.dedent(FAKE_BACKEND))
    (tmp_path / "fake_program.py").write_text(textwrap.dedent(PROGRAM))
    return tmp_path


def config(region: str, zone: str | None = None) -> dict[str, object]:
    fakecloud = {"name": "fc", "type": "fakecloud", "fakecloud": {"region": region}}
    where = placement(None, None, zone=zone)
    return stack_config([fakecloud], [proxy("f", "fc", replicas=2, where=where)])


def test_a_fifth_backend_in_its_own_package_deploys_and_is_in_the_manifest(
    fake_package: Path,
) -> None:
    result = run_program("fake_program:main", config("eu-1"), env={"PYTHONPATH": str(fake_package)})
    result.raise_for_error()
    vms = result.resources_of_type("fakecloud:index:Vm")
    assert sorted(vm.inputs["replica"] for vm in vms) == ["f-0", "f-1"]
    proxies = result.output("fleet")["proxies"]
    assert [(p["name"], p["type"], p["zone"]) for p in proxies] == [
        ("f-0", "fakecloud", "eu-1"),
        ("f-1", "fakecloud", "eu-1"),
    ]
    assert all(p["host"].endswith(".fake.invalid") for p in proxies)


def test_the_fifth_backend_s_own_rules_are_in_the_all_errors_message(fake_package: Path) -> None:
    result = run_program(
        "fake_program:main",
        {**config("nowhere", zone="z1"), "squid": {}},
        env={"PYTHONPATH": str(fake_package)},
    )
    assert result.error is not None
    message = result.error.message
    assert "invalid stack config (3 errors)" in message, message
    assert "providers[0].fakecloud.region: no such region 'nowhere'" in message
    assert "proxies[0].placement.zone: fakecloud has no zones" in message
    assert "squid.allowedClients: required" in message
    assert result.resources_of_type("fakecloud:index:Vm") == []
