"""The surge (discovery/brake.py; issue 39, finding 8): beyond a rate of wrong
tokens over all addresses every unknown source waits, so rotating over more
addresses than the table holds gains nothing, with bounded memory. A clock
the test turns, guessers simulated at a given rate."""

from __future__ import annotations

from discovery.brake import MAX_ADDRESSES, MAX_DELAY_S, SURGE_FAILURES, SURGE_WINDOW_S, Brake
from tests.support.brakes import Clock, warnings_kept


def v4(n: int) -> str:
    return f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


def rotate(brake: Brake, clock: Clock, addresses: list[str], guesses: int, rate: float) -> int:
    """A guesser sending `guesses` wrong tokens, `rate` a second, each from the
    next address in turn, compared only when the brake lets it; how many were."""
    compared = 0
    for n in range(guesses):
        address = addresses[n % len(addresses)]
        if brake.retry_after(address) == 0:
            brake.failed(address, "bearer")
            compared += 1
        clock.now += 1 / rate
    return compared


def bound(seconds: float) -> float:
    """At most the limit, plus what decayed meanwhile (by e every window)."""
    return SURGE_FAILURES + 1 + seconds * (SURGE_FAILURES + 1) / SURGE_WINDOW_S


def test_rotating_past_the_table_has_no_cliff() -> None:
    """The issue's rate, 5,703 guesses a second, rotated over 9,000 addresses,
    over 10,500 (past the table: before, none was braked), and over the
    65,536 /64s of a /48: each is compared at the surge's rate, no faster,
    and the table stays bounded."""
    rate = 5_703.0
    rotations = {  # the addresses, and how many times round them
        "9,000 IPv4": ([v4(n) for n in range(9_000)], 2),
        "10,500 IPv4": ([v4(n) for n in range(MAX_ADDRESSES + 500)], 2),
        "a /48's /64s": ([f"2001:db8:7:{n:x}::1" for n in range(65_536)], 1),
    }
    for name, (addresses, rounds) in rotations.items():
        clock = Clock()
        brake = Brake(clock=clock)
        guesses = rounds * len(addresses)
        compared = rotate(brake, clock, addresses, guesses, rate)
        assert SURGE_FAILURES <= compared <= bound(guesses / rate), (name, compared)
        assert len(brake) <= MAX_ADDRESSES


def test_the_surge_starts_past_the_limit_and_ends_as_it_decays() -> None:
    clock = Clock()
    brake = Brake(clock=clock)
    brake.succeeded("192.0.2.1")
    for n in range(SURGE_FAILURES):  # one each: no address is braked by its own count
        brake.failed(v4(n), "bearer")
    assert brake.retry_after("198.51.100.1") == 0  # at the limit, not past it
    brake.failed(v4(SURGE_FAILURES), "bearer")
    assert brake.retry_after("198.51.100.1") == 1  # any unknown source, right token or not
    assert brake.retry_after(v4(0)) == 1
    assert brake.retry_after("192.0.2.1") == 0  # a known one is compared
    assert brake.refusal_detail("198.51.100.1", 1).startswith(
        "too many wrong tokens from many addresses: no token from 198.51.100.1 is checked"
    )
    assert not brake.closed("198.51.100.1")
    clock.now += SURGE_WINDOW_S * 0.002  # 601 decays below 600 in 0.1 s
    assert brake.retry_after("198.51.100.1") == 0


def test_a_rate_below_the_limit_never_slows_anyone() -> None:
    """Nine wrong tokens a second for ten minutes (crawlers with an old
    token, say), from 1,000 addresses: every one compared, no surge."""
    clock = Clock()
    brake = Brake(clock=clock)
    addresses = [v4(n) for n in range(1_000)]
    assert rotate(brake, clock, addresses, 9 * 600, 9.0) == 9 * 600
    assert brake.retry_after("198.51.100.1") == 0


def test_the_surges_wait_is_capped_and_known_guessers_feed_it() -> None:
    """A guesser on a known address is compared at full speed (its price,
    docs/discovery.md); its failures still count, and unknown sources wait,
    never longer than MAX_DELAY_S at a time."""
    clock = Clock()
    brake = Brake(clock=clock)
    brake.succeeded("10.0.0.1")
    for _ in range(20_000):
        brake.failed("10.0.0.1", "bearer")
    assert brake.retry_after("10.0.0.1") == 0
    assert brake.retry_after("198.51.100.1") == MAX_DELAY_S
    clock.now += SURGE_WINDOW_S * 3  # 20,000 / e^3 = 996: still past the limit
    assert 1 <= brake.retry_after("198.51.100.1") < MAX_DELAY_S
    clock.now += SURGE_WINDOW_S
    assert brake.retry_after("198.51.100.1") == 0


def test_a_surge_is_logged_once_a_minute_with_what_it_refused() -> None:
    clock = Clock()
    brake = Brake(clock=clock, surge_failures=10, log_every=60.0)
    with warnings_kept("wrong tokens from many addresses") as kept:
        for n in range(11):
            brake.failed(v4(n), "bearer")
        for n in range(7):
            brake.retry_after(v4(100 + n))  # refused: counted in the next line
        brake.succeeded("192.0.2.1")
        for _ in range(50):  # more failures within the minute: no more lines
            brake.failed("192.0.2.1", "bearer")
        first = list(kept.fields)
        clock.now += 60
        for _ in range(30):
            brake.failed("192.0.2.1", "bearer")
    assert first == [
        {
            "via": "bearer",
            "recent_failures": 11,
            "limit": 10,
            "unknown_closed_for_s": 6,  # 60 s * ln(11 / 10)
            "refused": 0,
            "addresses": 11,
        }
    ]
    assert len(kept.fields) == 2 and kept.fields[1]["refused"] == 7
    assert kept.fields[1]["addresses"] == 12
