"""Known sources (discovery/brake.py; issue 39, finding 2): an address that
presented the right token lately is compared even while closed, so a client
with the token is never refused for another's failures; the table is
bounded and forgets; the login form's failures are counted on a brake of
their own. A clock the test turns."""

from __future__ import annotations

from discovery.brake import KNOWN_FOR_S, Brake
from discovery.ui import Sessions
from tests.support.brakes import Clock, fail

TOKEN = "known-token-" + "0f1e2d3c4b5a" * 3


def test_a_known_address_is_compared_however_many_failures_it_has() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    brake.succeeded("10.0.0.1")  # a crawler behind the NAT
    assert fail(brake, "10.0.0.1", 12)[-1] == 60  # a page beside it guesses
    assert brake.retry_after("10.0.0.1") == 0  # every token is compared
    assert brake.closed("10.0.0.1")  # though the address is closed for 60 s
    # An address that never presented the token waits, its right token too.
    fail(brake, "10.0.0.2", 6)
    assert brake.retry_after("10.0.0.2") == 2
    clock.now += 2
    brake.succeeded("10.0.0.2")  # once open, its right token makes it known
    fail(brake, "10.0.0.2", 3)
    assert brake.retry_after("10.0.0.2") == 0


def test_a_known_host_does_not_let_off_its_64() -> None:
    brake = Brake(clock=Clock())
    brake.succeeded("2001:db8:1:2::1")
    fail(brake, "2001:db8:1:2::bad", 6)  # another host of the same /64
    assert brake.retry_after("2001:db8:1:2::bad") == 2
    assert brake.retry_after("2001:db8:1:2::1") == 0
    brake.succeeded("2001:db8:1:2::1")  # its success clears nobody's count
    assert brake.retry_after("2001:db8:1:2::bad") == 2
    assert brake.refusal_detail("2001:db8:1:2::bad", 2) == (
        "too many wrong tokens from 2001:db8:1:2::/64: no token is checked for 2 s"
    )


def test_an_address_is_known_for_an_hour_after_its_last_right_token() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    assert brake.known_for == KNOWN_FOR_S == 3600
    brake.succeeded("10.0.0.1")
    clock.now += KNOWN_FOR_S - 1
    brake.succeeded("10.0.0.1")  # each right token starts the hour again
    clock.now += KNOWN_FOR_S - 1
    fail(brake, "10.0.0.1", 6)
    assert brake.retry_after("10.0.0.1") == 0
    clock.now += 1
    assert brake.retry_after("10.0.0.1") == 1  # an hour without: braked as any other
    assert brake.known == 0


def test_the_known_table_is_bounded_the_least_recently_right_dropped_first() -> None:
    clock = Clock()
    brake = Brake(clock=clock, max_known=3)
    for host in (1, 2, 3, 1, 4, 5):  # 1 is right again before 4 comes: 2, then 3 go
        brake.succeeded(f"10.0.0.{host}")
        clock.now += 1
    assert brake.known == 3
    for host in range(1, 6):
        fail(brake, f"10.0.0.{host}", 6)
    waits = {host: brake.retry_after(f"10.0.0.{host}") for host in range(1, 6)}
    assert waits == {1: 0, 2: 2, 3: 2, 4: 0, 5: 0}
    for n in range(10_000):
        brake.succeeded(f"10.1.{n >> 8}.{n & 255}")
        assert brake.known <= 3


def test_expired_known_addresses_are_forgotten_on_the_way() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    for host in range(100):
        brake.succeeded(f"10.0.0.{host}")
    clock.now += KNOWN_FOR_S
    brake.failed("192.0.2.1", "bearer")
    assert brake.known == 0


def test_the_login_form_counts_its_failures_apart_from_the_api() -> None:
    api = Brake(clock=Clock())
    sessions = Sessions(TOKEN, brake=api)
    assert sessions.brake is api and sessions.login_brake is not api
    for _ in range(10):
        sessions.login_brake.failed("10.0.0.1", "login")
    assert sessions.login_brake.retry_after("10.0.0.1") > 0
    assert api.retry_after("10.0.0.1") == 0 and len(api) == 0
