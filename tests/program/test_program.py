"""The stack program under mocks: config in, resources and `fleet` out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from proxyinfra.fleet import PROXY_TYPE
from proxyinfra.manifest import Manifest, load_schema
from proxyinfra.names import proxy_id
from proxyinfra.stackfile import read_raw
from tests.harness.program import run_program
from tests.support.mock_clouds import HOOK as CLOUD_MOCKS
from tests.support.stack_config import external_provider, host, kvm_provider, proxy, stack_config
from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = "proxyinfra.program:main"


def test_dev_stack_registers_its_proxies_and_exports_a_valid_manifest(testbed: Testbed) -> None:
    # The dev stack names the testbed's key files, so the testbed must be up.
    raw = read_raw(ROOT / "Pulumi.dev.yaml")
    result = run_program(PROGRAM, raw, stack="dev", new_resource_hook=CLOUD_MOCKS)
    result.raise_for_error()
    proxies = result.resources_of_type(PROXY_TYPE)
    assert [p.name for p in proxies] == ["home-0", "home-1"]
    dynamic = sorted(r.name for r in result.resources_of_type("pulumi-python:dynamic:Resource"))
    assert dynamic == sorted(
        [
            f"home-{i}-{kind}"
            for i in (0, 1)
            for kind in ("credentials", "overlay", "seed", "domain")
        ]
        + [next(n for n in dynamic if "-image-" in n)]
    )
    fleet = result.output("fleet")
    jsonschema.validate(fleet, load_schema())
    manifest = Manifest.model_validate(fleet)
    assert (manifest.project, manifest.stack) == ("egress-proxies", "dev")
    assert [p.id for p in manifest.proxies] == [
        proxy_id("egress-proxies", "dev", p.name) for p in manifest.proxies
    ]


def test_dev_stack_points_at_the_testbed_scripts_testbed_makes(testbed: Testbed) -> None:
    # The README's main job runs the dev stack against `scripts/testbed up`:
    # its host, key files and allowed clients must be the testbed's.
    dev = read_raw(ROOT / "Pulumi.dev.yaml")
    made = yaml.safe_load(testbed.provider_yaml.read_text())
    (provider,) = dev["providers"]
    host, made_host = provider["kvm"]["hosts"][0], made["kvm"]["hosts"][0]
    for key in ("address", "user", "pool", "network", "domainType"):
        assert host[key] == made_host[key], key
    for key in ("sshKeyFile", "knownHostsFile"):
        assert (ROOT / provider["kvm"][key]).resolve() == Path(made["kvm"][key]).resolve(), key
    assert dev["squid"]["allowedClients"] == [str(testbed.subnet)]


def external_config() -> dict[str, Any]:
    proxies = [
        proxy("corp-1", "corp", url="http://alice:s%40cret@10.0.0.5:3128"),
        proxy("corp-2", "corp", url="http://10.0.0.6:8080", labels={"site": "b"}),
    ]
    return stack_config([external_provider()], proxies, {})


def test_external_proxies_in_the_manifest_with_secret_credentials() -> None:
    result = run_program(PROGRAM, external_config(), stack="prod")
    result.raise_for_error()
    fleet = result.output("fleet")
    jsonschema.validate(fleet, load_schema())
    assert fleet["stack"] == "prod"
    first, second = fleet["proxies"]
    assert first == {
        "name": "corp-1",
        "id": proxy_id("egress-proxies", "prod", "corp-1"),
        "provider": "corp",
        "type": "external",
        "zone": None,
        "host": "10.0.0.5",
        "port": 3128,
        "labels": {},
        "auth": {"username": "alice", "password": "s@cret"},
    }
    assert "auth" not in second and second["port"] == 8080 and second["labels"] == {"site": "b"}
    # A password in the manifest makes the whole output a Pulumi secret.
    assert result.is_secret("fleet")


def test_manifest_without_credentials_is_not_secret() -> None:
    config = external_config()
    config["proxies"] = config["proxies"][1:]
    result = run_program(PROGRAM, config)
    result.raise_for_error()
    assert not result.is_secret("fleet")


def test_bad_config_fails_with_one_message_before_any_resource() -> None:
    config = external_config()
    config["proxies"][0]["replicas"] = 2
    config["proxies"][1]["provider"] = "nowhere"
    config["proxies"].append({"name": "Bad_Name", "provider": "corp", "url": "http://h:1"})
    config["squid"] = {"port": 0}
    config["unknown"] = 1
    result = run_program(PROGRAM, config)
    assert result.error is not None
    assert result.error.message.splitlines() == [
        "invalid stack config (5 errors):",
        "  egress-proxies:unknown: unknown key (allowed: providers, proxies, squid, autopilot, "
        "generations, discovery)",
        "  proxies[2].name: must be 1-40 lowercase letters, digits or '-', starting with a letter "
        "(got 'Bad_Name')",
        "  squid.port: Input should be greater than or equal to 1 (got 0)",
        "  proxies[0].replicas: not allowed for an external proxy: one entry per URL",
        "  proxies[1].provider: unknown provider 'nowhere' (providers: corp)",
    ]
    assert result.resources == []  # nothing registered


def test_insecure_host_keys_are_warned_about_at_program_start(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("k")
    config = external_config()
    lab = host("h1", network="default")
    config["providers"].append(kvm_provider(key, insecure=True, name="lab", hosts=[lab]))
    result = run_program(PROGRAM, config)
    result.raise_for_error()
    warning = next(line for line in result.stderr.splitlines() if "insecureIgnoreHostKey" in line)
    assert "not verified" in warning and "impersonate" in warning and "'lab'" in warning
