"""One discovery service over several stacks' fleets (`--fleet` repeated):
their union served with names qualified by stack, each file re-read on its
own, a broken one keeping its last good fleet without hiding the others,
and the leases of proxies that stay kept throughout. The real app on a
loopback socket, health verdicts from a fake."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.fleet import FleetError
from discovery.service import Service
from tests.support.discovery import ServerThread, proxies, proxy_entry, settings_for, wait_for

pytestmark = pytest.mark.integration


def write_stack(path: Path, stack: str, names: list[str]) -> None:
    """A stack's manifest (`pulumi stack output --json` of stack STACK), atomically."""
    entries = [proxy_entry(n, port=4000 + i, labels={"stack": stack}) for i, n in enumerate(names)]
    document = {"version": 1, "project": "egress-proxies", "stack": stack, "proxies": entries}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"fleet": document}))
    os.replace(tmp, path)


def grant(http: httpx.Client, stack: str) -> dict[str, Any]:
    answer = http.post("/v1/leases", json={"holder": "h", "selector": {"labels": {"stack": stack}}})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_two_stacks_are_served_as_one_fleet_and_one_broken_hides_nothing(tmp_path: Path) -> None:
    site_a, site_b = tmp_path / "site-a.json", tmp_path / "site-b.json"
    write_stack(site_a, "site-a", ["home-0", "home-1"])
    write_stack(site_b, "site-b", ["home-0"])  # the same short name in another stack
    settings = settings_for(tmp_path, fleet_files=(site_a, site_b), file_poll=0.1)
    with ServerThread(settings) as running, httpx.Client(base_url=running.url, timeout=10) as http:
        assert set(proxies(http)) == {"site-a/home-0", "site-a/home-1", "site-b/home-0"}
        lease_a = grant(http, "site-a")
        lease_b = grant(http, "site-b")
        assert lease_b["proxy"]["name"] == "site-b/home-0"

        site_a.write_text('{"fleet": {"version": 1, "proj')  # broken, mid-write
        wait_for(lambda: http.get("/readyz").status_code == 503, what="unready")
        not_ready = http.get("/readyz").json()
        assert not_ready["error"] == "fleet_unreadable" and "site-a.json" in not_ready["detail"]
        # Its last good fleet is still served, and the other stack moves on.
        write_stack(site_b, "site-b", ["home-0", "home-1"])
        wait_for(lambda: "site-b/home-1" in proxies(http), what="site-b's new proxy")
        assert set(proxies(http)) >= {"site-a/home-0", "site-a/home-1"}
        for lease in (lease_a, lease_b):
            assert http.post(f"/v1/leases/{lease['id']}/renew").status_code == 200

        # Readable again, without home-1: only that proxy leaves.
        kept = lease_a["proxy"]["name"].split("/")[1]
        write_stack(site_a, "site-a", [kept])
        wait_for(lambda: http.get("/readyz").status_code == 200, what="ready again")
        assert set(proxies(http)) == {f"site-a/{kept}", "site-b/home-0", "site-b/home-1"}
        assert http.post(f"/v1/leases/{lease_a['id']}/renew").status_code == 200


def test_two_fleets_of_one_stack_are_refused_at_start(tmp_path: Path) -> None:
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    write_stack(first, "prod", ["a"])
    write_stack(second, "prod", ["b"])
    settings = settings_for(tmp_path, fleet_files=(first, second))
    with pytest.raises(FleetError, match="are both fleets of stack 'prod': give each stack once"):
        Service(settings).open()
