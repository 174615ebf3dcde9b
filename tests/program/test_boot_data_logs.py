"""The stack program under mocks at EGRESS_PROXIES_LOG=2 with a proxy of each
backend that renders boot data (kvm, gcp with cloud-init and with a startup
script, kubernetes): no log record of any logger in the program's process
carries a password, a password hash or a line of the boot data it registers.

Records are taken at every level from every logger
(tests/support/logcapture.py), so a line that the level filters out today
counts too. The renderers on their own, and the seed ISO's upload:
tests/unit/test_boot_data_logs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from providers.gcp.squid_sync import CONF_KEY, PASSWORDS_KEY
from providers.kvm.seeddocs import unpacked
from tests.harness.program import ProgramResult, run_program
from tests.support.logcapture import ENV_LOG_FILE, leaks, telling_lines
from tests.support.mock_clouds import DEBIAN, DYNAMIC, HOOK, INSTANCE, UBUNTU
from tests.support.stack_config import (
    placement,
    proxy,
    set_kvm,
    squid,
    stack_config,
    unreachable_kvm_provider,
)

PROGRAM = "tests.support.logcapture:program_main"
SECRET = "kubernetes:core/v1:Secret"
USER_TOKEN = "crawler-api-token-51c9e4"
OWN_USER_DATA = (
    f"#cloud-config\nwrite_files:\n  - path: /etc/crawler/token\n    content: {USER_TOKEN}\n"
)
VENDOR_TOKEN = "registry-token-0a7f3d"
OWN_VENDOR_DATA = f"#!/bin/sh\necho 'registry-login: {VENDOR_TOKEN}' > /etc/registry-login\n"


def fleet_config(directory: Path) -> dict[str, Any]:
    kvm = set_kvm(unreachable_kvm_provider(directory), vendor_data=OWN_VENDOR_DATA)
    gcp = {
        "project": "crawl-proj-1",
        "region": "europe-west1",
        "zones": ["europe-west1-b"],
        "images": {"debian": DEBIAN, "ubuntu": UBUNTU},
    }
    providers = [
        kvm,
        {"name": "gcp-eu", "type": "gcp", "gcp": gcp},
        {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress"}},
    ]
    proxies = [
        proxy("home", "home", where=placement(), user_data=OWN_USER_DATA),
        proxy("eu", "gcp-eu", where=placement("e2-small", "debian")),
        proxy(
            "eu-ubuntu", "gcp-eu", where=placement("e2-small", "ubuntu"), user_data=OWN_USER_DATA
        ),
        proxy("pods", "cluster"),
    ]
    return stack_config(providers, proxies, squid("10.8.0.0/16", username="crawler"))


def secrets_of(result: ProgramResult) -> list[str]:
    """Every password and hash the program made, and the telling lines of
    every boot document it registered."""
    found = [USER_TOKEN, VENDOR_TOKEN]
    documents: list[str] = []
    for resource in result.resources:
        if resource.type == DYNAMIC and resource.name.endswith("-credentials"):
            found += [resource.outputs["password"], resource.outputs["password_hash"]]
        elif resource.type == DYNAMIC and resource.name.endswith("-seed"):
            packed = unpacked(resource.inputs)  # providers/kvm/seeddocs.py
            documents += [packed["userData"], packed["vendorData"]]
        elif resource.type == INSTANCE:
            metadata = resource.inputs["metadata"]
            documents += [metadata.get("user-data", ""), metadata.get("startup-script", "")]
            documents += [metadata[CONF_KEY], metadata[PASSWORDS_KEY]]
        elif resource.type == SECRET:
            documents.append(resource.inputs["stringData"]["passwords"])
    assert len(found) == 2 + 2 * 4  # a password and a hash for each of the four proxies
    assert len(documents) == 2 + 2 * 4 + 1  # a seed, two instances, a Secret
    return found + [line for document in documents for line in telling_lines(document)]


def test_the_program_logs_no_password_hash_or_boot_document(tmp_path: Path) -> None:
    records = tmp_path / "records.log"
    records.touch()
    result = run_program(
        PROGRAM,
        fleet_config(tmp_path),
        new_resource_hook=HOOK,
        env={"EGRESS_PROXIES_LOG": "2", ENV_LOG_FILE: str(records)},
    ).raise_for_error()
    logged = [records.read_text(), result.stdout, result.stderr]
    # The capture saw the process's records: the Pulumi SDK's own debug lines.
    assert "registering resource" in logged[0]
    assert leaks(logged, secrets_of(result)) == []
