"""The brake on guessing the token (discovery/brake.py): per-address backoff
with a clock the test turns, a bounded table, bounded warnings; then the
real app in this process: bearer tokens on /v1/* and /ui/api/status and the
login form slowed down to 429, never a token in the log; and the minimum
token length at start."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from discovery.brake import MAX_DELAY_S, Brake, client_key
from discovery.cli import MIN_TOKEN_LENGTH
from discovery.ui import COOKIE
from tests.support.brakes import Clock, fail, warnings_kept
from tests.support.discovery import ROOT, app_client, proxy_entry, settings_for, write_fleet
from tests.support.logcapture import every_record

TOKEN = "brake-token-" + "7c6b5a4f3e2d" * 3
WRONG = "wrong-guess-" + "0a1b2c3d" * 3


def test_a_few_failures_are_free_then_the_wait_doubles_up_to_the_cap() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    assert fail(brake, "10.0.0.1", 4) == [0, 0, 0, 0]
    assert brake.retry_after("10.0.0.1") == 0
    waits = []
    for _ in range(10):
        waits.append(brake.failed("10.0.0.1", "bearer"))
        assert brake.retry_after("10.0.0.1") == waits[-1]
        clock.now += waits[-1]  # the address waits its turn, then guesses again
        assert brake.retry_after("10.0.0.1") == 0
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert brake.retry_after("10.0.0.2") == 0  # other addresses are not braked


def test_the_wait_counts_down_and_a_right_token_does_not_clear_the_count() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    fail(brake, "10.0.0.1", 8)  # closed for 8 s
    clock.now += 2.5
    assert brake.retry_after("10.0.0.1") == 6  # whole seconds, rounded up
    clock.now += 6
    brake.succeeded("10.0.0.1")  # known from now on (test_discovery_brake_known.py)
    assert len(brake) == 1 and brake.known == 1
    assert fail(brake, "10.0.0.1", 1) == [16]  # the count goes on


def test_ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key(None) == "unknown"
    brake = Brake(clock=Clock())
    for host in range(5):  # five hosts of one /64 are one guesser
        brake.failed(f"2001:db8:1:2::{host + 1}", "bearer")
    assert brake.retry_after("2001:db8:1:2::ffff") == 1


def test_the_table_stays_bounded_under_many_addresses_and_forgets() -> None:
    clock = Clock()
    brake = Brake(clock=clock, max_addresses=1000)
    for n in range(50_000):
        brake.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", "bearer")
        assert len(brake) <= 1000
    assert len(brake) == 1000
    clock.now += brake.forget_after
    brake.failed("192.0.2.1", "bearer")  # every older record is forgotten on the way
    assert len(brake) == 1


def test_a_full_table_drops_its_oldest_record_so_fresh_guessers_are_still_slowed() -> None:
    """Issue 43, item 4: with the newest record dropped instead, a guesser
    alternating two addresses the full table lacks pushes each out with the
    other and stays at one failure for ever, never slowed."""
    clock = Clock()
    brake = Brake(clock=clock, max_addresses=4, surge_failures=1_000_000)
    for host in range(4):  # the table full of older failures, one each
        fail(brake, f"10.0.0.{host}", 1)
        clock.now += 1
    closures = []
    for _ in range(6):
        closures += [brake.failed("192.0.2.1", "bearer"), brake.failed("192.0.2.2", "bearer")]
        clock.now += 0.001
    assert len(brake) == 4
    assert closures[-2:] == [2, 2]  # each of them on its 6th failure, the wait doubled
    assert brake.retry_after("192.0.2.1") == 2 and brake.retry_after("192.0.2.2") == 2
    # The two oldest records made room for them; the newer ones kept their count.
    assert fail(brake, "10.0.0.3", 4) == [0, 0, 0, 1]  # its 5th failure
    assert fail(brake, "10.0.0.0", 4) == [0, 0, 0, 0]  # counted afresh


def test_failures_are_logged_once_per_address_and_interval() -> None:
    clock = Clock()
    brake = Brake(clock=clock, log_every=60.0, max_warnings=3)
    with warnings_kept("wrong token") as kept:
        fail(brake, "10.0.0.1", 7)  # the 7th closes the address for 4 s
        clock.now += 1
        assert brake.retry_after("10.0.0.1") == 3  # refused: counted in the next line
        clock.now += 60
        fail(brake, "10.0.0.1", 1)
        for host in range(2, 10):  # more addresses than lines allowed per minute
            fail(brake, f"10.0.0.{host}", 1)
        fields = list(kept.fields)
        clock.now += 60
        fail(brake, "10.0.0.4", 1)
    assert len(fields) == 4  # 10.0.0.1 twice, then two others up to the bound
    assert fields[0] == {
        "client": "10.0.0.1",
        "via": "bearer",
        "failures": 1,
        "unlogged": 0,
        "refused": 0,
        "closed_for_s": 0,
        "warnings_held_back": 0,
    }
    assert fields[1]["failures"] == 8 and fields[1]["unlogged"] == 6
    assert fields[1]["refused"] == 1 and fields[1]["closed_for_s"] == 8
    assert [f["client"] for f in fields[2:]] == ["10.0.0.2", "10.0.0.3"]
    last = kept.fields[-1]  # a minute on: the held-back lines are counted
    assert last["client"] == "10.0.0.4" and last["warnings_held_back"] == 6
    assert last["failures"] == 2 and last["unlogged"] == 1


# -- the real app ----------------------------------------------------------------------------


def served(tmp_path: Path, client: tuple[str, int] = ("192.0.2.7", 40000)):  # type: ignore[no-untyped-def]
    settings = settings_for(tmp_path, token=TOKEN)
    assert settings.fleet_file is not None
    write_fleet(settings.fleet_file, [proxy_entry("a")])
    return app_client(settings, client=client)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_wrong_bearer_tokens_on_the_api_are_braked_to_429(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(tmp_path) as (http, _):
            # No header is no guess: never braked.
            for _ in range(10):
                assert (await http.post("/v1/leases", json={"holder": "c"})).status_code == 401
            statuses = [
                (await http.post("/v1/leases", headers=bearer(WRONG), json={})).status_code
                for _ in range(5)
            ]
            assert statuses == [401] * 5
            braked = await http.post("/v1/leases", headers=bearer(WRONG), json={"holder": "c"})
            assert braked.status_code == 429 and braked.headers["retry-after"] == "1"
            assert braked.json() == {
                "error": "too_many_requests",
                "detail": "too many wrong tokens from 192.0.2.7: no token is checked for 1 s",
            }
            # While braked not even the right token is compared (this address
            # never presented it): the answer must not tell a guesser that a
            # guess was right.
            assert (await http.get("/v1/proxies", headers=bearer(TOKEN))).status_code == 429

    with every_record() as records:
        asyncio.run(scenario())
    assert not [r for r in records if WRONG in r or TOKEN in r]
    assert any("wrong token" in r and "192.0.2.7" in r for r in records)


def test_wrong_tokens_on_the_status_data_and_the_login_form_are_braked(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(tmp_path, client=("2001:db8::5", 40000)) as (http, _):
            for _ in range(5):
                answer = await http.get("/ui/api/status", headers=bearer(WRONG))
                assert answer.status_code == 401
            answer = await http.get("/ui/api/status", headers=bearer(TOKEN))
            assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
            assert answer.json()["error"] == "too_many_requests"
            assert "2001:db8::/64" in answer.json()["detail"]

        async with served(tmp_path / "login", client=("192.0.2.8", 40000)) as (http, _):
            for _ in range(5):
                answer = await http.post("/ui/login", data={"token": WRONG})
                assert answer.status_code == 401 and "Wrong token." in answer.text
            answer = await http.post("/ui/login", data={"token": TOKEN})
            assert answer.status_code == 429 and answer.headers["retry-after"] == "1"
            assert "Too many wrong tokens" in answer.text and COOKIE not in answer.cookies
            assert "text/html" in answer.headers["content-type"]

    (tmp_path / "login").mkdir()
    with every_record() as records:
        asyncio.run(scenario())
    assert not [r for r in records if WRONG in r or TOKEN in r or "Traceback" in r]
    assert any("wrong token" in r and "login" in r for r in records)


def test_the_wait_is_capped_whatever_the_failures() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    for _ in range(2000):  # 2 ** 2000 would overflow a float
        brake.failed("10.0.0.1", "login")
        clock.now += MAX_DELAY_S
    assert brake.failed("10.0.0.1", "login") == MAX_DELAY_S


# -- the token's length ------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["t0ken", "x" * (MIN_TOKEN_LENGTH - 1)])
def test_a_short_token_is_refused_at_start_without_showing_it(tmp_path: Path, token: str) -> None:
    # Refused before anything is read or opened: the fleet file need not exist.
    command = [sys.executable, "-m", "discovery", "serve", "--fleet", str(tmp_path / "f.json")]
    command += ["--listen", "127.0.0.1:1", "--db", str(tmp_path / "l.db")]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DISCOVERY_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"DISCOVERY_TOKEN is shorter than {MIN_TOKEN_LENGTH} characters" in done.stderr
    assert token not in done.stderr and token not in done.stdout
    assert not (tmp_path / "l.db").exists()


def test_a_token_of_the_minimum_length_is_taken() -> None:
    from discovery.cli import parser, settings_from

    args = parser().parse_args(["serve", "--fleet", "f", "--listen", "0.0.0.0:1", "--db", "d"])
    token = "k" * MIN_TOKEN_LENGTH
    assert settings_from(args, {"DISCOVERY_TOKEN": token}).token == token
