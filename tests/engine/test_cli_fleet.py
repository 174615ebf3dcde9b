"""The real Pulumi CLI on the testbed: preview, up, refresh and destroy of a
kvm fleet, each step asserting what an operator sees.

One stack goes through its life in order (the tests of this module share it):
preview of the new stack, up, outputs and state, no perpetual diff, a
placement change replacing one proxy, drift repaired (a stopped or removed
domain, a definition changed out of band), destroy and gc. The
tiny test image boots to its DHCP lease in seconds under TCG; squid and
cloud-init are proved by tests/integration/test_end_to_end.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import libvirt
import pytest

from providers.kvm.domainxml import parse_domain
from proxyinfra.manifest import load_schema
from proxyinfra.names import overlay_volume, proxy_id, seed_volume
from tests.support import proxyinfra_cli
from tests.support.http import FileServer
from tests.support.images import tiny_image
from tests.support.pulumi_cli import CliStack
from tests.support.stack_config import (
    ALL_AT_ONCE,
    image,
    machine_type,
    placement,
    proxy,
    squid,
    stack_config,
    the_testbed_provider,
)
from tests.support.testbed import URI, Testbed, refresh_pool

pytestmark = [pytest.mark.integration, pytest.mark.pulumi_cli]

NAMES = ("home-0", "home-1", "solo-0")
DYNAMIC = "pulumi-python:dynamic:Resource"


def fleet_config(testbed: Testbed, image_url: str, solo_image: str = "tiny") -> dict[str, Any]:
    provider = the_testbed_provider(
        testbed,
        # The same file under two URLs: two bases (named by URL without a digest).
        images={"tiny": image(image_url), "tiny-b": image(image_url + "?b")},
        machine_types={"small": machine_type(1, 256)},
        ip_timeout=180,
    )
    name = provider["name"]
    proxies = [
        proxy(
            "home", name, replicas=2, where=placement("small", "tiny"), max_unavailable=ALL_AT_ONCE
        ),
        proxy("solo", name, replicas=1, where=placement("small", solo_image)),
    ]
    return stack_config([provider], proxies, squid(str(testbed.subnet), username="crawler"))


@dataclass
class Fleet:
    stack: CliStack
    testbed: Testbed
    server: FileServer
    url: str
    _conn: Any = None

    @property
    def conn(self) -> Any:
        """The testbed's libvirtd, connected again when a `testbed_alone`
        test of another worker restarted it since this module's last use."""
        if self._conn is not None:
            try:
                self._conn.getLibVersion()  # a round trip: fails on a restarted daemon
            except libvirt.libvirtError:
                with contextlib.suppress(libvirt.libvirtError):
                    self._conn.close()
                self._conn = None
        if self._conn is None:
            self._conn = libvirt.open(URI)
        return self._conn

    @property
    def ids(self) -> dict[str, str]:
        return {n: proxy_id("egress-proxies", self.stack.stack, n) for n in NAMES}

    def host_objects(self) -> tuple[set[str], set[str]]:
        """(domains, pool volumes) on the testbed right now."""
        pool = self.conn.storagePoolLookupByName(self.testbed.pool)
        refresh_pool(pool)
        return (
            {d.name() for d in self.conn.listAllDomains(0)},
            {v.name() for v in pool.listAllVolumes(0)},
        )


def steps(preview_json: str) -> list[dict[str, Any]]:
    return list(json.loads(preview_json).get("steps") or [])


def resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def resource_type(urn: str) -> str:
    """The resource's own type (a child's URN carries its parents' types before `$`)."""
    return urn.split("::")[2].rsplit("$", 1)[-1]


@pytest.fixture(scope="module")
def fleet(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    image = tiny_image()
    directory = tmp_path_factory.mktemp("cli-fleet")
    name = f"cli{uuid.uuid4().hex[:6]}"
    with FileServer() as server:
        url = server.add(f"/{name}/tiny.qcow2", file=image)
        stack = CliStack(directory, name, fleet_config(testbed, url))
        fleet = Fleet(stack, testbed, server, url)
        try:
            yield fleet
        finally:
            # Whatever a failed test left: the stack's own destroy, then gc.
            if stack.resources():
                stack.run("destroy", "--yes", "--skip-preview")
            if fleet._conn is not None:
                fleet._conn.close()


@pytest.mark.testbed_alone  # compares everything on the host before and after
def test_preview_of_a_new_stack_lists_every_resource_and_changes_nothing(fleet: Fleet) -> None:
    before = fleet.host_objects()
    done = fleet.stack.ok("preview", "--json")
    planned = steps(done.stdout)
    assert {s["op"] for s in planned} == {"create"}, planned
    names = sorted(resource_name(s["urn"]) for s in planned if resource_type(s["urn"]) == DYNAMIC)
    per_proxy = [
        f"{n}-{kind}" for n in NAMES for kind in ("credentials", "domain", "overlay", "seed")
    ]
    bases = [n for n in names if "-image-" in n]
    assert len(bases) == 1 and bases[0].startswith("testbed-testbed-image-")
    assert sorted(set(names) - set(bases)) == sorted(per_proxy)
    assert fleet.host_objects() == before, "a preview must not touch the host"
    assert fleet.server.count(f"/{fleet.stack.stack}/tiny.qcow2") == 0


def test_up_brings_the_fleet_up_and_exports_manifest_v1(fleet: Fleet) -> None:
    done = fleet.stack.ok("up", "--yes", "--skip-preview")
    assert re.search(r"Resources:\s+\+ 1[0-9] created", done.stdout), done.stdout[-2000:]
    # The provider's log (EGRESS_PROXIES_LOG, default info) is where a user
    # looks: the CLI prints it as messages of the stack, with the Diagnostics.
    diagnostics = done.stdout.split("Diagnostics:", 1)[-1]
    for pid in fleet.ids.values():
        assert re.search(rf"INFO kvm .*name={pid} domain has address 10\.251\.77\.\d+", diagnostics)
    assert "base image fetched into host pool" in diagnostics
    # One base for the three proxies: fetched once.
    assert fleet.server.count(f"/{fleet.stack.stack}/tiny.qcow2") == 1
    manifest = fleet.stack.output("fleet")
    jsonschema.validate(manifest, load_schema())
    by_name = {p["name"]: p for p in manifest["proxies"]}
    assert sorted(by_name) == sorted(NAMES)
    domains, volumes = fleet.host_objects()
    net = fleet.conn.networkLookupByName(fleet.testbed.network)
    leases = {lease["ipaddr"] for lease in net.DHCPLeases()}
    for name, pid in fleet.ids.items():
        entry = by_name[name]
        assert entry["id"] == pid and pid in domains
        assert overlay_volume(pid) in volumes and seed_volume(pid) in volumes
        assert entry["host"] in leases, "the exported address is the VM's DHCP lease"
        assert entry["auth"]["username"] == "crawler" and len(entry["auth"]["password"]) >= 16


def test_discovery_reads_the_stack_output_by_itself(fleet: Fleet) -> None:
    """`python -m discovery serve --stack NAME` runs `pulumi stack output` itself."""
    from tests.support.discovery import ServiceProcess, free_port, proxies, wait_for

    port = free_port()
    args = ["--stack", fleet.stack.stack, "--db", str(fleet.stack.directory / "leases.db")]
    args += ["--listen", f"127.0.0.1:{port}", "--probe-interval", "60"]
    env = {**fleet.stack.env(), "DISCOVERY_TOKEN": "t" * 32}
    # From the checkout (the project egress-proxies), as an operator beside it runs it.
    service = ServiceProcess(
        args, log_path=fleet.stack.directory / "discovery.log", env=env
    ).start()
    try:
        import httpx

        with httpx.Client(
            base_url=service.url, headers={"Authorization": "Bearer " + "t" * 32}
        ) as c:
            wait_for(lambda: sorted(proxies(c)) == sorted(NAMES), timeout=60, interval=0.5)
    finally:
        service.stop()


def test_nothing_secret_is_in_plain_text_in_the_state(fleet: Fleet) -> None:
    state = fleet.stack.ok("stack", "export").stdout
    manifest = fleet.stack.output("fleet")
    for entry in manifest["proxies"]:
        assert entry["auth"]["password"] not in state
    resources = json.loads(state)["deployment"]["resources"]
    seeds = [r for r in resources if r["urn"].endswith("-seed")]
    assert len(seeds) == len(NAMES)
    for seed in seeds:
        packed = seed["inputs"]["documents"]  # kept once, in the inputs
        assert isinstance(packed, dict) and "ciphertext" in packed, packed
        assert not {"userData", "metaData"} & set(seed["outputs"]), sorted(seed["outputs"])
    assert "#cloud-config" not in state and "$2b$" not in state  # user-data, bcrypt hashes


def test_preview_right_after_up_expects_no_changes(fleet: Fleet) -> None:
    fleet.stack.ok("preview", "--expect-no-changes", "--diff")


def test_a_placement_change_replaces_exactly_that_proxy(fleet: Fleet) -> None:
    solo = fleet.ids["solo-0"]
    domains_before, _ = fleet.host_objects()
    uuids = {n: fleet.conn.lookupByName(pid).UUIDString() for n, pid in fleet.ids.items()}
    fleet.stack.write_config(fleet_config(fleet.testbed, fleet.url, solo_image="tiny-b"))
    done = fleet.stack.ok("preview", "--diff", "--json")
    changed = {resource_name(s["urn"]): s for s in steps(done.stdout) if s["op"] != "same"}
    replaced = {
        n
        for n, s in changed.items()
        if s["op"] in ("replace", "delete-replaced", "create-replacement")
    }
    assert replaced == {"solo-0-overlay", "solo-0-domain"}, changed.keys()
    new_base = {n for n, s in changed.items() if s["op"] == "create"}
    assert len(new_base) == 1 and next(iter(new_base)).startswith("testbed-testbed-image-")
    overlay = changed["solo-0-overlay"]
    assert "basePath" in (overlay.get("diffReasons") or overlay.get("replaceReasons") or [])
    text = fleet.stack.ok("preview", "--diff").stdout
    assert "solo-0-overlay" in text and "basePath" in text

    fleet.stack.ok("up", "--yes", "--skip-preview")
    after = {n: fleet.conn.lookupByName(pid).UUIDString() for n, pid in fleet.ids.items()}
    assert after["solo-0"] != uuids["solo-0"], "solo-0's domain was replaced"
    assert {n: u for n, u in after.items() if n != "solo-0"} == {
        n: u for n, u in uuids.items() if n != "solo-0"
    }, "the other proxies were left alone"
    # Of this stack's domains (other stacks' come and go on the testbed meanwhile).
    ours_before = domains_before & set(fleet.ids.values())
    domains_after, _ = fleet.host_objects()
    assert solo in domains_after and domains_after >= ours_before
    fleet.stack.ok("preview", "--expect-no-changes")


def test_drift_is_shown_by_refresh_and_repaired_by_up(fleet: Fleet) -> None:
    stopped, undefined = fleet.ids["home-0"], fleet.ids["home-1"]
    fleet.conn.lookupByName(stopped).destroy()
    dom = fleet.conn.lookupByName(undefined)
    dom.destroy()
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    done = fleet.stack.ok("refresh", "--yes", "--skip-preview", "--diff")
    assert "home-0-domain" in done.stdout and "home-1-domain" in done.stdout
    assert re.search(r"state\s*:\s*\"running\"\s*=>\s*\"shutoff\"", done.stdout), done.stdout[
        -3000:
    ]
    assert re.search(
        r"-\s+pulumi-python:dynamic:Resource\s+home-1-domain\s+deleted", done.stdout
    ) or ("home-1-domain" in done.stdout and "deleted" in done.stdout), done.stdout[-3000:]
    fleet.stack.ok("up", "--yes", "--skip-preview")
    for pid in (stopped, undefined):
        assert fleet.conn.lookupByName(pid).isActive()
    fleet.stack.ok("preview", "--expect-no-changes")


def test_a_definition_changed_out_of_band_is_shown_by_refresh_and_repaired_by_up(
    fleet: Fleet,
) -> None:
    pid = fleet.ids["solo-0"]
    # As `virsh setmaxmem --config` would: the next boot gets 384 MiB, not 256.
    fleet.conn.lookupByName(pid).setMemoryFlags(
        384 * 1024, libvirt.VIR_DOMAIN_AFFECT_CONFIG | libvirt.VIR_DOMAIN_MEM_MAXIMUM
    )
    done = fleet.stack.ok("refresh", "--yes", "--skip-preview", "--diff")
    assert "solo-0-domain" in done.stdout
    assert re.search(r"memoryMib\s*:\s*256\s*=>\s*384", done.stdout), done.stdout[-3000:]
    preview = fleet.stack.ok("preview", "--diff", "--json")
    changed = {resource_name(s["urn"]): s for s in steps(preview.stdout) if s["op"] != "same"}
    assert set(changed) >= {"solo-0-domain"}, changed.keys()
    assert all(name == "solo-0-domain" for name in changed), changed.keys()
    reasons = changed["solo-0-domain"].get("replaceReasons") or []
    assert "memoryMib" in reasons, changed["solo-0-domain"]
    fleet.stack.ok("up", "--yes", "--skip-preview")
    xml = fleet.conn.lookupByName(pid).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert parse_domain(xml).memory_mib == 256
    fleet.stack.ok("refresh", "--yes", "--skip-preview")
    fleet.stack.ok("preview", "--expect-no-changes")


def test_destroy_leaves_only_the_cached_bases_and_gc_finds_nothing(fleet: Fleet) -> None:
    bases = {
        r["outputs"]["volume"]
        for r in fleet.stack.resources()
        if "-image-" in resource_name(r["urn"]) and resource_type(r["urn"]) == DYNAMIC
    }
    assert len(bases) == 2  # tiny, and tiny-b since the placement change
    fleet.stack.ok("destroy", "--yes", "--skip-preview")
    domains, volumes = fleet.host_objects()
    assert bases <= volumes, "the cached bases stay (keepOnDestroy)"
    for pid in fleet.ids.values():
        assert pid not in domains
        assert overlay_volume(pid) not in volumes and seed_volume(pid) not in volumes
    # gc reads the state with `pulumi stack export`, as an operator's shell would.
    gc = proxyinfra_cli(
        fleet.stack.directory,
        "gc",
        "--stack",
        fleet.stack.stack,
        "--min-age",
        "0",
        env=fleet.stack.env(),
    )
    assert gc.returncode == 0, gc.stderr
    assert "no orphans" in gc.stdout, gc.stdout
