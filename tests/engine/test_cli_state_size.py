"""What the state keeps per kvm proxy, through the real CLI on simulated
hosts (docs/kvm-provider.md, "State per proxy"): no document twice, short
stack traces, the host block without its usual values, the pickled provider
in plain text. `scripts/bench stack_scale` measures the bytes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from providers.kvm.access import LEFT_OUT
from providers.kvm.seeddocs import DIGEST, DOCUMENTS, PACKED
from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.stacktrace import KEPT
from tests.support.baseimages import random_qcow2, serve
from tests.support.http import FileServer
from tests.support.pulumi_cli import CliStack
from tests.support.simulated_fleet import fleet_config, simulated_env

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

# Resource name suffix -> the module of its class.
KVM_RESOURCES = {"seed": "seediso", "overlay": "overlay", "domain": "domain", "image": "baseimage"}


@pytest.fixture(scope="module")
def resources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """The state's resources after `up` of two proxies, by name."""
    where = tmp_path_factory.mktemp("state-size")
    with FileServer() as server:
        image = serve(server, random_qcow2(where, data_mib=1, virtual_mib=16))
        stack = CliStack(
            where / "stack",
            "size",
            fleet_config(2, 1, where, image.url),
            simulated_env(where / "hosts"),
        )
        stack.ok("up", "--yes", "--skip-preview")
        yield {r["urn"].rsplit("::", 1)[1]: r for r in stack.resources()}


def _kvm(resources: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: r for n, r in resources.items() if r["type"] == "pulumi-python:dynamic:Resource"}


def _kind(name: str) -> str:
    return next(kind for kind in KVM_RESOURCES if kind in name.split("-"))


def test_a_seed_keeps_its_documents_once(resources: dict[str, dict[str, Any]]) -> None:
    seeds = [r for name, r in _kvm(resources).items() if _kind(name) == "seed"]
    assert len(seeds) == 2
    for seed in seeds:
        assert not set(DOCUMENTS) & set(seed["inputs"]), sorted(seed["inputs"])
        assert "ciphertext" in seed["inputs"][PACKED]  # all of them, packed, a secret
        assert not set(DOCUMENTS) & set(seed["outputs"]), sorted(seed["outputs"])
        assert "ciphertext" in seed["outputs"][DIGEST]  # a secret, like the documents


def test_each_kvm_resource_keeps_where_it_registers_and_nothing_below(
    resources: dict[str, dict[str, Any]],
) -> None:
    kvm = _kvm(resources)
    assert len(kvm) == 7
    for name, resource in kvm.items():
        frames = _frames(resource)
        module = KVM_RESOURCES[_kind(name)]
        assert f"/providers/kvm/{module}.py#" in frames[0], (name, frames)
    proxies = [r for r in resources.values() if r["type"] == PROXY_TYPE]
    assert len(proxies) == 2
    for proxy in proxies:
        assert all("/proxyinfra/fleet.py#" in frame for frame in _frames(proxy)), proxy


def test_a_proxy_s_manifest_entry_is_kept_once_in_the_stack_s_output(
    resources: dict[str, dict[str, Any]],
) -> None:
    proxies = {name: r for name, r in resources.items() if r["type"] == PROXY_TYPE}
    assert len(proxies) == 2
    for name, proxy in proxies.items():
        assert set(proxy["outputs"]) == {"id"}, (name, proxy["outputs"])
    stack = next(r for r in resources.values() if r["type"] == "pulumi:pulumi:Stack")
    listed = {entry["name"] for entry in stack["outputs"]["fleet"]["proxies"]}
    assert listed == set(proxies)


def _frames(resource: dict[str, Any]) -> list[str]:
    frames = [f.get("sourcePosition", "") for f in resource["stackTrace"]]
    assert len(frames) == KEPT, (resource["urn"], frames)
    return frames


def test_the_host_block_leaves_out_its_usual_values_and_the_provider_is_plain(
    resources: dict[str, dict[str, Any]],
) -> None:
    for name, resource in _kvm(resources).items():
        for part in ("inputs", "outputs"):
            host = resource[part]["host"]
            usual = {k for k, v in LEFT_OUT.items() if k in host and host[k] == v}
            assert not usual, (name, part, host)
            assert {"address", "user", "key_file", "provider", "host"} <= set(host)
            assert isinstance(resource[part]["__provider"], str), (name, part)
