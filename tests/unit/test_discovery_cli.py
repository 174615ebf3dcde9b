"""`python -m discovery serve`: its flags (docs/discovery.md) and the refusals."""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from discovery.cli import main, parser, settings_from
from discovery.settings import is_loopback, split_host_port
from discovery.sqlite.store import SqliteStore
from tests.support.discovery import proxy_entry, write_fleet

ROOT = Path(__file__).resolve().parents[2]
BASE = ["serve", "--fleet", "f.json", "--listen", "127.0.0.1:8080", "--db", "l.db"]


def settings(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return settings_from(parser().parse_args(argv), env or {})


def test_every_flag_of_the_design() -> None:
    s = settings(
        [
            "serve",
            "--fleet",
            "out.json",
            "--listen",
            "[::1]:9000",
            "--db",
            "/var/lib/discovery/leases.db",
            "--probe-target",
            "www.example.com:443",
            "--probe-interval",
            "2.5",
            "--lease-cooldown",
            "120",
            "--max-lease-ttl",
            "90",
            "--health-workers",
            "32",
        ],
        {"DISCOVERY_TOKEN": "t0ken-" + "0123456789"},
    )
    assert (s.listen_host, s.listen_port) == ("::1", 9000)
    assert s.fleet_file == Path("out.json") and s.stack is None
    assert s.db == Path("/var/lib/discovery/leases.db")
    assert s.probe_targets == ("www.example.com:443",)
    assert (s.probe_interval, s.lease_cooldown, s.max_lease_ttl) == (2.5, 120, 90)
    assert s.health_workers == 32
    assert s.token == "t0ken-0123456789"
    assert "t0ken" not in repr(s)


def test_stack_instead_of_fleet_or_several_of_both() -> None:
    s = settings(["serve", "--stack", "prod", "--listen", "127.0.0.1:1", "--db", "x"])
    assert s.stack == "prod" and s.fleet_file is None
    both = settings([*BASE, "--stack", "site-a", "--stack", "site-b", "--fleet", "more.json"])
    assert both.stacks == ("site-a", "site-b")
    assert both.fleet_files == (Path("f.json"), Path("more.json"))
    with pytest.raises(ValueError, match="give the fleet: --fleet FILE or --stack NAME"):
        settings(["serve", "--listen", "127.0.0.1:1", "--db", "x"])


def test_defaults() -> None:
    s = settings(BASE)
    assert s.token is None
    assert s.probe_interval == 10 and s.max_lease_ttl == 300 and s.lease_cooldown == 600
    assert s.health_workers == 256 and s.stack_refresh == 60
    assert s.probe_targets == ("example.com:443",)


def test_several_probe_targets_in_their_order_each_once() -> None:
    s = settings([*BASE, "--probe-target", "a.example:443", "--probe-target", "[::1]:8443"])
    assert s.probe_targets == ("a.example:443", "[::1]:8443")
    with pytest.raises(ValueError, match=r"--probe-target a.example:443 is given twice"):
        settings([*BASE, "--probe-target", "a.example:443", "--probe-target", "a.example:443"])


def test_without_a_token_only_loopback_unless_told_otherwise() -> None:
    remote = ["serve", "--fleet", "f", "--listen", "0.0.0.0:8080", "--db", "d"]
    with pytest.raises(ValueError, match="DISCOVERY_TOKEN"):
        settings(remote)
    assert settings(remote, {"DISCOVERY_TOKEN": "x" * 16}).listen_host == "0.0.0.0"
    assert settings([*remote, "--allow-remote-without-token"]).token is None
    assert settings(["serve", "--fleet", "f", "--listen", "localhost:1", "--db", "d"])


@pytest.mark.parametrize(
    "bad",
    [
        ["--listen", "8080"],
        ["--listen", "::1:8080"],
        ["--listen", "host:99999"],
        ["--probe-interval", "0"],
        ["--probe-interval", "-1"],
        ["--max-lease-ttl", "nan"],
        ["--lease-cooldown", "-5"],
        ["--health-workers", "0"],
        ["--probe-target", "nohostport"],
    ],
)
def test_bad_values_are_usage_errors(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parser().parse_args([*BASE, *bad])
    assert caught.value.code == 2


def test_a_cooldown_of_zero_turns_cooldowns_off() -> None:
    assert settings([*BASE, "--lease-cooldown", "0"]).lease_cooldown == 0


def test_refusal_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISCOVERY_TOKEN", raising=False)
    assert main(["serve", "--fleet", "f", "--listen", "10.1.2.3:80", "--db", "d"]) == 2
    assert "refusing to listen on 10.1.2.3" in capsys.readouterr().err


def test_a_missing_fleet_file_stops_the_service_with_exit_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "discovery",
            *BASE[:2],
            str(tmp_path / "none.json"),
            *BASE[3:5],
            "--db",
            str(tmp_path / "l.db"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot read" in done.stderr and "none.json" in done.stderr


def test_host_port_helpers() -> None:
    assert split_host_port("[::1]:80") == ("::1", 80)
    assert split_host_port("a.example:0") == ("a.example", 0)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    write_fleet(tmp_path / "f.json", [proxy_entry("a")])
    command = [sys.executable, "-m", "discovery", "serve", "--fleet", str(tmp_path / "f.json")]
    command += ["--db", str(tmp_path / "l.db"), "--probe-target", "127.0.0.1:9", *args]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_store_in_use_stops_a_second_service_with_exit_1(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "l.db")
    store.open()
    try:
        done = _serve(tmp_path, "--listen", "127.0.0.1:1")
    finally:
        store.close()
    assert done.returncode == 1
    assert "in use by another discovery service" in done.stderr


def test_a_taken_port_stops_the_service_with_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _serve(tmp_path, "--listen", f"127.0.0.1:{taken.getsockname()[1]}")
    assert done.returncode == 1
    assert "address already in use" in done.stderr


def test_the_server_runs_with_its_long_lived_state_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Full collections walked the whole fleet mid-request (discovery/heap.py):
    what exists once the service has started (the lease book and what it
    holds for the fleet) is frozen, and so is a new fleet once applied;
    young collections are rarer."""
    import asyncio
    import os
    import signal
    import time

    import uvicorn

    from discovery import heap
    from discovery.fleet import FleetProxy
    from discovery.sqlite.book import SqliteBook

    fleet_file = tmp_path / "f.json"
    seen: dict[str, object] = {}

    def tracked(kind: type) -> list[object]:
        return [o for o in gc.get_objects() if isinstance(o, kind)]

    async def lifespan(app: object) -> None:
        """What uvicorn does around serving: start-up, then (here) a fleet
        change by SIGHUP, then shutdown."""
        inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        started = asyncio.Event()

        async def send(message: dict[str, str]) -> None:
            if message["type"] == "lifespan.startup.complete":
                started.set()

        async def serve() -> None:
            await app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)  # type: ignore[operator]

        await inbox.put({"type": "lifespan.startup"})
        task = asyncio.ensure_future(serve())
        await asyncio.wait_for(started.wait(), 10)
        seen["books tracked"] = len(tracked(SqliteBook))
        seen["threshold"] = gc.get_threshold()
        freezes = gc.get_freeze_count()
        write_fleet(fleet_file, [proxy_entry("a"), proxy_entry("b", port=3129)])
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 10
        while gc.get_freeze_count() == freezes and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        seen["proxies tracked after the change"] = len(tracked(FleetProxy))
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 10)

    monkeypatch.setattr(uvicorn.Server, "run", lambda self: asyncio.run(lifespan(self.config.app)))
    write_fleet(fleet_file, [proxy_entry("a")])
    thresholds = gc.get_threshold()
    try:
        main(
            [
                "serve",
                "--fleet",
                str(fleet_file),
                "--listen",
                "127.0.0.1:1",
                "--db",
                str(tmp_path / "l.db"),
                "--probe-target",
                "127.0.0.1:9",
            ]
        )
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert seen["books tracked"] == 0  # built by start(), then frozen
    assert seen["proxies tracked after the change"] == 0  # the new fleet, frozen once applied
    assert seen["threshold"] == (heap.YOUNG_THRESHOLD, *heap.OLDER_THRESHOLDS)


def test_the_starting_line_shows_no_database_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `starting` line names the database as `PostgresUrl.shown` does:
    whatever form the password takes in the URL, it is not in the line."""
    import signal
    import types
    from types import SimpleNamespace

    import uvicorn
    from prometheus_client import CollectorRegistry

    from discovery.cli import run_server
    from tests.support.logcapture import every_record

    url = "postgresql://postgres@127.0.0.1:1/db?password=hunter2&sslpassword=hunt%65r3"
    settings = settings_from(
        parser().parse_args(["serve", "--fleet", "f", "--listen", "127.0.0.1:1", "--db", url]), {}
    )
    # The server itself is not run: only what run_server logs before it.
    fake_app = types.ModuleType("discovery.app")
    fake_app.create_app = lambda service: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "discovery.app", fake_app)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    service = SimpleNamespace(settings=settings, registry=CollectorRegistry(), close=lambda: None)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with every_record() as records:
            run_server(service)  # type: ignore[arg-type]
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    [starting] = [r for r in records if " starting" in r.splitlines()[0]]
    assert "postgresql://postgres:***@127.0.0.1:1/db?sslpassword=***" in starting
    assert not [r for r in records if "hunter" in r or "hunt" in r]


def test_a_signal_before_uvicorn_takes_over_stops_the_server_once_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM after the `starting` line and before uvicorn's own handlers are
    in place (seen: `scripts/up serve` stopped just after it had started ran
    on) stops the server as soon as it has started. Were it lost, the server
    would run on until a second SIGTERM, which a guard sends (and notes) so
    that the test fails instead of hanging."""
    import signal
    import threading
    import types
    from types import SimpleNamespace
    from typing import Any

    from prometheus_client import CollectorRegistry

    import discovery.cli
    import discovery.logs
    from discovery.cli import run_server

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while scope["type"] == "lifespan":
            message = await receive()
            await send({"type": f"{message['type']}.complete"})
            if message["type"] == "lifespan.shutdown":
                return

    fake_app = types.ModuleType("discovery.app")
    fake_app.create_app = lambda service: app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "discovery.app", fake_app)
    logged: list[str] = []
    real_event = discovery.logs.event

    def event(logger: Any, level: int, name: str, **fields: Any) -> None:
        real_event(logger, level, name, **fields)
        logged.append(name)
        if name == "starting":
            signal.raise_signal(signal.SIGTERM)  # handled before server.run()

    monkeypatch.setattr(discovery.cli, "event", event)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["serve", "--fleet", "f", "--listen", f"127.0.0.1:{port}", "--db", "unused.db"]
    settings = settings_from(parser().parse_args(args), {})
    service = SimpleNamespace(settings=settings, registry=CollectorRegistry(), close=lambda: None)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    guard_fired = threading.Event()

    def guard() -> None:
        guard_fired.set()
        signal.raise_signal(signal.SIGTERM)

    timer = threading.Timer(30, guard)
    timer.start()
    try:
        assert run_server(service) == 0  # type: ignore[arg-type]
    finally:
        timer.cancel()
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert not guard_fired.is_set(), "the first SIGTERM was lost: the server ran on"
    assert logged[:2] == ["starting", "stopped by signal"]


def test_the_store_from_the_environment_when_no_db_flag() -> None:
    """The stack's pods give the store as $DISCOVERY_DB (from a Secret), so its
    URL and password are on no command line and in no pod spec."""
    base = ["serve", "--fleet", "f", "--listen", "127.0.0.1:1"]
    url = "postgresql://discovery:s3cret-pw@db.example:5432/postgres"
    s = settings(base, {"DISCOVERY_DB": url})
    assert str(s.db) == "postgresql://discovery:***@db.example:5432/postgres"
    assert settings([*base, "--db", "l.db"], {"DISCOVERY_DB": url}).db == Path("l.db")
    with pytest.raises(ValueError, match=r"give the lease store: --db PATH\|URL or \$DISCOVERY_DB"):
        settings(base)
    with pytest.raises(
        ValueError,
        match=r"DISCOVERY_DB: 'mysql://\*\*\*@h/db': 'mysql' is not a supported database",
    ):
        settings(base, {"DISCOVERY_DB": "mysql://u:pw@h/db"})
