"""Names that reach logs and pages (issue 39, findings 6, 7 and 10), through
the real service on both stores:

- a fleet file whose names no log or store can keep (3,000 characters, NUL,
  U+0085, a right-to-left override, U+2028, an unpaired surrogate) is refused
  as any invalid manifest is: the last good fleet stays, one log line names
  the proxy, `/readyz` says `fleet_unreadable` naming it, and the next good
  file is applied (PostgreSQL took the service out on the long name, and
  dropped the whole change on the NUL);
- two stacks whose qualified names would collide (`a` + `b/c`, `a/b` + `c`)
  cannot be served together: a stack name holds no `/`;
- a holder or a selector field with such characters is a 400 naming the
  field, and changes nothing.

The service is `python -m discovery serve` for the fleet files (its log is
the one an operator reads), the app under uvicorn in a thread for the API."""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from discovery.database import PostgresUrl
from tests.support.discovery import (
    ServerThread,
    ServiceProcess,
    free_port,
    proxies,
    proxy_entry,
    settings_for,
    wait_for,
    write_fleet,
)
from tests.support.postgres import postgres as postgres

pytestmark = pytest.mark.integration

STORES = ["sqlite", "postgres"]
RELOAD_FAILED = "fleet reload failed; keeping the current fleet"


def database(store: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What --db takes: an SQLite file, or a fresh database of the session's PostgreSQL."""
    if store == "sqlite":
        return str(tmp_path / "leases.db")
    server: Any = request.getfixturevalue("postgres")
    url: str = server.fresh_database(f"names_{random.randrange(1 << 30)}")
    return url


def write_stack(path: Path, stack: str, entries: list[dict[str, Any]]) -> None:
    """A stack's manifest, written atomically (a rename, as `mv` does)."""
    document = {"version": 1, "project": "egress-proxies", "stack": stack, "proxies": entries}
    staged = path.with_name(path.name + ".new")
    staged.write_text(json.dumps(document))
    os.replace(staged, path)


def serve(fleets: list[Path], db: str, log: Path) -> ServiceProcess:
    args = [arg for fleet in fleets for arg in ("--fleet", str(fleet))]
    args += ["--db", db, "--listen", f"127.0.0.1:{free_port()}"]
    args += ["--probe-target", "127.0.0.1:9", "--probe-interval", "0.5"]
    return ServiceProcess(args, log_path=log)


def readiness(url: str) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(url + "/readyz", timeout=5)
    body: dict[str, Any] = answer.json()
    return answer.status_code, body


def incompressible(length: int) -> str:
    """Hex digits no compression shortens (PostgreSQL compresses long index keys)."""
    digits = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(length // 64 + 1))
    return digits[:length]


# -- finding 6 (and 10): a fleet file with names no log or store can keep -------------------


def named(name: str, port: int) -> dict[str, Any]:
    """A proxy entry called NAME (its id from the port: a surrogate has no UTF-8 to hash)."""
    return {**proxy_entry(f"p{port}", port=port), "name": name}


LONG = "p-" + incompressible(2998)
# (what is wrong, the proxy's entry, what the refusal shows of the proxy, of the field)
BAD_ENTRIES = [
    ("3,000 characters", named(LONG, 4100), "'" + LONG[:20], "name"),
    ("NUL", named("p\x00x", 4101), "'p\\x00x'", "U+0000"),
    ("NEL", named("p\x85x", 4102), "'p\\x85x'", "U+0085"),
    ("RLO", named("p\u202ex", 4103), "'p\\u202ex'", "U+202E"),
    ("U+2028", named("p\u2028x", 4104), "'p\\u2028x'", "U+2028"),
    ("surrogate", named("p\ud800x", 4105), "'p\\ud800x'", "U+D800"),
    (
        "label",
        proxy_entry("p-label", port=4106, labels={"site": "home\u2028"}),
        "'p-label'",
        "labels.site",
    ),
    ("zone", proxy_entry("p-zone", port=4107, zone="z\x00"), "'p-zone'", "zone"),
    ("provider", proxy_entry("p-prov", port=4108, provider="c\u202e"), "'p-prov'", "provider"),
]


@pytest.mark.parametrize("store", STORES)
def test_a_fleet_with_a_name_no_log_or_store_can_keep_is_refused_and_the_last_good_one_kept(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    fleet = tmp_path / "fleet.json"
    write_fleet(fleet, [proxy_entry("p0", port=4000)])
    service = serve([fleet], database(store, request, tmp_path), tmp_path / "service.log")
    try:
        service.start()
        http = httpx.Client(base_url=service.url, timeout=5)
        for what, entry, shown, field in BAD_ENTRIES:
            # The change adds a good proxy too: nothing of a refused file is applied.
            bad = [proxy_entry("p0", port=4000), proxy_entry("p-new", port=4001), entry]
            write_fleet(fleet, bad)
            wait_for(lambda: readiness(service.url)[0] == 503, what=f"{what}: refused")
            body = readiness(service.url)[1]
            assert body["error"] == "fleet_unreadable", (what, body)
            assert "proxies.2" in body["detail"] and shown in body["detail"], (what, body)
            assert field in body["detail"], (what, body)
            assert set(proxies(http)) == {"p0"}, what  # the last good fleet
            lines = service.events()
            [line] = [e for e in lines if e["event"] == RELOAD_FAILED]
            assert shown in line["error"] and field in line["error"], (what, line)
            others = [
                e for e in lines if e is not line and (e["level"] == "error" or "exception" in e)
            ]
            assert not others, (what, others)
            # A good file is applied as ever, and the service is ready again.
            write_fleet(fleet, [proxy_entry("p0", port=4000)])
            wait_for(lambda: readiness(service.url)[0] == 200, what=f"{what}: ready again")
            service.log_path.write_text("")  # the next case's lines only
        write_fleet(fleet, [proxy_entry("p0", port=4000), proxy_entry("p-new", port=4001)])
        wait_for(lambda: set(proxies(http)) == {"p0", "p-new"}, what="the good change")
        assert readiness(service.url)[0] == 200
    finally:
        service.stop()


# -- finding 7: two stacks' qualified names ------------------------------------------------


@pytest.mark.parametrize("store", STORES)
def test_stacks_whose_qualified_names_would_collide_are_not_served_together(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    """`a` + `b/c` and `a/b` + `c` were both `a/b/c`: three proxies served as two."""
    first, second = tmp_path / "a.json", tmp_path / "second.json"
    write_stack(first, "a", [proxy_entry("b/c", port=4000), proxy_entry("d", port=4001)])
    write_stack(second, "a/b", [proxy_entry("c", port=4002)])
    db = database(store, request, tmp_path)

    refused = serve([first, second], db, tmp_path / "refused.log")
    try:
        refused.start(wait_ready=False)
        assert refused.process is not None
        process = refused.process
        wait_for(lambda: process.poll() is not None, timeout=20, what="the service to exit")
        assert process.returncode == 1
        [line] = [e for e in refused.events() if e["event"] == "cannot start"]
        assert str(second) in line["error"] and "stack: 'a/b'" in line["error"], line
    finally:
        refused.stop()

    write_stack(second, "x", [proxy_entry("c", port=4002)])
    service = serve([first, second], db, tmp_path / "service.log")
    try:
        service.start()
        http = httpx.Client(base_url=service.url, timeout=5)
        served = {"a/b/c", "a/d", "x/c"}
        assert set(proxies(http)) == served
        write_stack(second, "a/b", [proxy_entry("c", port=4002), proxy_entry("e", port=4003)])
        wait_for(lambda: readiness(service.url)[0] == 503, what="the stack refused")
        body = readiness(service.url)[1]
        assert body["error"] == "fleet_unreadable", body
        assert str(second) in body["detail"] and "stack: 'a/b'" in body["detail"], body
        assert set(proxies(http)) == served  # the last good fleets, every proxy apart
    finally:
        service.stop()


# -- finding 10: holders and selectors through the API -------------------------------------


@pytest.fixture(params=STORES)
def api(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    db: Any = tmp_path / "leases.db"
    if request.param == "postgres":
        db = PostgresUrl(database("postgres", request, tmp_path))
    settings = settings_for(tmp_path, db=db)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("p0", zone="z1", labels={"k": "v"})])
    with ServerThread(settings) as running, httpx.Client(base_url=running.url, timeout=10) as http:
        wait_for(lambda: proxies(http)["p0"]["health"] == "healthy")
        yield http


BAD_CHARACTERS = ["\u0085", "\u202e", "\u2028", "\u2029", "\u200b", "\ufeff", "\U000e0041"]


@pytest.mark.parametrize("character", BAD_CHARACTERS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_holder_or_selector_with_a_control_or_format_character_is_a_400_naming_the_field(
    api: httpx.Client, character: str
) -> None:
    code = f"U+{ord(character):04X}"
    c = f"x{character}"
    for body, field in [
        ({"holder": c}, "holder"),
        ({"holder": "h", "selector": {"provider": c}}, "selector.provider"),
        ({"holder": "h", "selector": {"zone": c}}, "selector.zone"),
        ({"holder": "h", "selector": {"labels": {"k": c}}}, "selector.labels.k"),
        ({"holder": "h", "selector": {"labels": {c: "v"}}}, "selector.labels"),
    ]:
        answer = api.post("/v1/leases", json=body)
        assert answer.status_code == 400, (body, answer.text)
        detail = answer.json()["detail"]
        assert answer.json()["error"] == "bad_request" and field in detail and code in detail
    report = {"holder": c, "session": "s1", "outcome": "blocked", "target": "shop.example"}
    answer = api.post("/v1/gateway/report", json=report)
    assert answer.status_code == 400 and "holder" in answer.json()["detail"], answer.text
    # Nothing changed: the proxy is free, uncooled, and leased to the next good request.
    [proxy] = api.get("/v1/proxies").json()["proxies"]
    assert (proxy["leased"], proxy["cooldowns"]) == (False, [])
    assert "discovery_leases_active 0.0" in api.get("/metrics").text
    granted = api.post("/v1/leases", json={"holder": "h", "selector": {"zone": "z1"}})
    assert granted.status_code == 201, granted.text
