"""`python -m discovery serve` as operators run it: a subprocess with the real
health engine probing real squids on 127.0.0.1 (CONNECT with credentials to a
local target), a SQLite store on disk, a fleet file that changes under it,
SIGKILL, SIGHUP and SIGTERM."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.discovery import (
    ServiceProcess,
    free_port,
    proxies,
    proxy_entry,
    wait_for,
    write_fleet,
)
from tests.support.squid import EchoServer, RunningSquid, loopback_settings, start_squid

pytestmark = pytest.mark.integration

TOKEN = "service-token-" + "9f8e7d6c5b4a" * 3
WRONG_TOKEN = "wrong-token-" + "0a1b2c3d4e5f" * 3
PASSWORD = "squid-pw-" + "k3ep-it-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def target() -> Iterator[EchoServer]:
    # What the probes CONNECT to through squid.
    listener = EchoServer()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def squid() -> Iterator[RunningSquid]:
    with start_squid(loopback_settings(auth_username="crawler"), password=PASSWORD) as running:
        yield running


def entry(name: str, port: int) -> dict[str, Any]:
    return proxy_entry(
        name, port=port, labels={"slot": name}, username="crawler", password=PASSWORD
    )


def service(
    tmp_path: Path, target: EchoServer, *extra: str, port: int | None = None
) -> ServiceProcess:
    args = ["--fleet", str(tmp_path / "fleet.json"), "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{port or free_port()}"]
    args += ["--probe-target", f"127.0.0.1:{target.port}", "--probe-interval", "0.5"]
    args += ["--max-lease-ttl", "120", "--lease-cooldown", "60", *extra]
    env = {"DISCOVERY_TOKEN": TOKEN, "EGRESS_PROXIES_LOG": "debug"}
    return ServiceProcess(args, log_path=tmp_path / "service.log", env=env)


def all_healthy(client: httpx.Client, names: set[str]) -> bool:
    listed = proxies(client)
    return set(listed) == names and all(p["health"] == "healthy" for p in listed.values())


def grant(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/leases", json={"holder": "crawler-1", **body})


def test_a_killed_service_keeps_every_lease_and_cooldown(
    tmp_path: Path, target: EchoServer, squid: RunningSquid
) -> None:
    write_fleet(tmp_path / "fleet.json", [entry(n, squid.port) for n in ("a", "b", "c", "d")])
    first = service(tmp_path, target).start()
    try:
        client = httpx.Client(base_url=first.url, headers=AUTH, timeout=10)
        wait_for(lambda: all_healthy(client, {"a", "b", "c", "d"}), timeout=15)
        a = grant(client, selector={"labels": {"slot": "a"}}, ttlSeconds=100).json()
        b = grant(client, selector={"labels": {"slot": "b"}}).json()
        assert (
            client.post(
                f"/v1/leases/{a['id']}/report", json={"outcome": "blocked", "target": "example.com"}
            ).status_code
            == 204
        )
        assert (
            client.post(f"/v1/leases/{b['id']}/report", json={"outcome": "blocked"}).status_code
            == 204
        )
        before = proxies(client)
        # Granted (answered) an instant before the crash: it must survive too.
        c = grant(client, selector={"labels": {"slot": "c"}}).json()
        first.kill()
    finally:
        first.stop()

    second = service(tmp_path, target, port=int(first.url.rsplit(":", 1)[1])).start()
    try:
        client = httpx.Client(base_url=second.url, headers=AUTH, timeout=10)
        after = proxies(client)
        for name in ("a", "b"):
            assert after[name]["leased"] is True
            assert after[name]["cooldowns"] == before[name]["cooldowns"]
        assert after["a"]["cooldowns"][0]["target"] == "example.com"
        assert after["b"]["cooldowns"][0]["target"] == "*"
        assert after["c"]["leased"] is True and after["d"]["leased"] is False
        renewed = client.post(f"/v1/leases/{a['id']}/renew", json={"ttlSeconds": 50})
        assert renewed.status_code == 200 and renewed.json()["proxy"] == a["proxy"]
        assert client.post(f"/v1/leases/{c['id']}/renew").status_code == 200
        # Leasing works again once the new engine has probed the fleet.
        wait_for(lambda: all_healthy(client, {"a", "b", "c", "d"}), timeout=15)
        assert grant(client).json()["proxy"]["name"] == "d"
        assert grant(client).status_code == 409
        assert client.delete(f"/v1/leases/{a['id']}").status_code == 204
        # a is still cooling down for example.com, b everywhere (and leased).
        denied = grant(client, target="https://example.com/")
        assert denied.status_code == 409 and 55 <= int(denied.headers["retry-after"]) <= 60
        assert grant(client, target="example.org").json()["proxy"]["name"] == "a"
    finally:
        second.stop()


def test_fleet_file_change_keeps_remaining_leases_and_probes_newcomers(
    tmp_path: Path, target: EchoServer, squid: RunningSquid
) -> None:
    fleet = tmp_path / "fleet.json"
    write_fleet(fleet, [entry("a", squid.port), entry("b", squid.port)])
    running = service(tmp_path, target).start()
    late_port = free_port()
    late: RunningSquid | None = None
    try:
        client = httpx.Client(base_url=running.url, headers=AUTH, timeout=10)
        wait_for(lambda: all_healthy(client, {"a", "b"}), timeout=15)
        a = grant(client, selector={"labels": {"slot": "a"}}).json()
        b = grant(client, selector={"labels": {"slot": "b"}}).json()

        # b leaves; c arrives on a port where no squid listens yet.
        write_fleet(fleet, [entry("a", squid.port), entry("c", late_port)])
        wait_for(lambda: set(proxies(client)) == {"a", "c"}, timeout=10)
        assert client.post(f"/v1/leases/{b['id']}/renew").status_code == 404
        assert client.post(f"/v1/leases/{a['id']}/renew").status_code == 200
        assert proxies(client)["a"]["leased"] is True
        wait_for(lambda: proxies(client)["c"]["health"] == "unhealthy", timeout=10)
        assert grant(client, selector={"labels": {"slot": "c"}}).status_code == 409

        late = start_squid(
            loopback_settings(auth_username="crawler"), password=PASSWORD, port=late_port
        )
        wait_for(lambda: grant_ok(client, "c", late_port), timeout=15)
        [changed] = [e for e in running.events() if e.get("event") == "fleet changed"]
        assert (changed["added"], changed["removed"]) == (["c"], ["b"])
        assert changed["leases_revoked"] == 1
    finally:
        running.stop()
        if late is not None:
            late.close()


def grant_ok(client: httpx.Client, slot: str, port: int) -> bool:
    answer = grant(client, selector={"labels": {"slot": slot}})
    if answer.status_code != 201:
        return False
    assert answer.json()["proxy"]["url"].endswith(f"@127.0.0.1:{port}")
    return True


def test_logs_hold_no_token_or_proxy_credentials_and_sigterm_stops_cleanly(
    tmp_path: Path, target: EchoServer, squid: RunningSquid
) -> None:
    write_fleet(tmp_path / "fleet.json", [entry("a", squid.port), entry("b", squid.port)])
    running = service(tmp_path, target).start()
    try:
        client = httpx.Client(base_url=running.url, headers=AUTH, timeout=10)
        wait_for(lambda: all_healthy(client, {"a", "b"}), timeout=15)
        lease = grant(client, target="example.com").json()
        assert PASSWORD in lease["proxy"]["url"]  # credentials in the lease answer only
        client.post(f"/v1/leases/{lease['id']}/report", json={"outcome": "error"})
        client.post(f"/v1/leases/{lease['id']}/renew")
        wrong = httpx.post(
            f"{running.url}/v1/leases",
            json={"holder": "x"},
            headers={"Authorization": f"Bearer {WRONG_TOKEN}"},
        )
        assert wrong.status_code == 401
        assert httpx.get(f"{running.url}/v1/proxies").status_code == 401
        listing = client.get("/v1/proxies").text
        assert PASSWORD not in listing
        running.process.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_for(lambda: "SIGHUP" in running.log(), timeout=5)
        assert running.terminate() == 0
    finally:
        running.stop()
    log = running.log()
    for secret in (TOKEN, WRONG_TOKEN, PASSWORD):
        assert secret not in log
    events = [json.loads(line) for line in log.splitlines()]  # every line is JSON
    names = [e["event"] for e in events]
    assert "request" in names  # debug level really logged each request
    assert names[-1] == "service stopped" or "service stopped" in names
    assert any(e.get("event") == "stopped by signal" and e["signal"] == "SIGTERM" for e in events)


def test_stack_mode_runs_pulumi_and_sighup_reloads(tmp_path: Path, target: EchoServer) -> None:
    # A stand-in `pulumi` that prints what the test puts in outputs.json, the way
    # `pulumi stack output fleet --json --show-secrets` prints the manifest.
    outputs = tmp_path / "outputs.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pulumi = bin_dir / "pulumi"
    pulumi.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\ncat {outputs}\n')
    pulumi.chmod(0o755)
    write_fleet(outputs, [entry("a", 9)])
    port = free_port()
    args = ["--stack", "prod", "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{port}", "--probe-target", f"127.0.0.1:{target.port}"]
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "DISCOVERY_STACK_REFRESH_SECONDS": "3600",  # only SIGHUP can bring the change
        "DISCOVERY_TOKEN": TOKEN,
    }
    running = ServiceProcess(args, log_path=tmp_path / "service.log", env=env).start()
    try:
        client = httpx.Client(base_url=running.url, headers=AUTH, timeout=10)
        assert set(proxies(client)) == {"a"}
        write_fleet(outputs, [entry("a", 9), entry("b", 10)])
        running.process.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_for(lambda: set(proxies(client)) == {"a", "b"}, timeout=10)
        calls = (tmp_path / "calls").read_text().splitlines()
        assert (
            calls == ["stack output fleet --json --show-secrets --stack prod --non-interactive"] * 2
        )
    finally:
        running.stop()


def test_probe_targets_tried_in_turn_and_a_closed_one_judged_down(
    tmp_path: Path, target: EchoServer, squid: RunningSquid, refused: str
) -> None:
    """The service wired to several targets: a port nothing listens on first
    (squid answers 503 there), the echo server second. Every proxy is healthy
    through the second; the first is judged down, said once in the log and
    in its gauge."""
    closed = refused
    names = {f"p{i}" for i in range(6)}
    write_fleet(tmp_path / "fleet.json", [entry(n, squid.port) for n in sorted(names)])
    args = ["--fleet", str(tmp_path / "fleet.json"), "--db", str(tmp_path / "leases.db")]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--probe-interval", "0.5"]
    args += ["--probe-target", closed, "--probe-target", f"127.0.0.1:{target.port}"]
    running = ServiceProcess(
        args, log_path=tmp_path / "service.log", env={"DISCOVERY_TOKEN": TOKEN}
    )
    running.start()
    try:
        client = httpx.Client(base_url=running.url, headers=AUTH, timeout=10)
        wait_for(lambda: all_healthy(client, names), timeout=15)

        def gauge(of: str) -> str | None:
            wanted = f'egress_health_probe_target_down{{target="{of}"}} '
            text = client.get("/metrics").text
            return next(
                (line.split()[-1] for line in text.splitlines() if line.startswith(wanted)), None
            )

        wait_for(lambda: gauge(closed) == "1.0", timeout=10)
        assert gauge(f"127.0.0.1:{target.port}") == "0.0"
        said = [e for e in running.events() if str(e.get("event", "")).startswith("probe target")]
        assert len(said) == 1 and said[0]["event"].startswith(f"probe target {closed} looks down")
        assert all_healthy(client, names)
    finally:
        running.stop()
