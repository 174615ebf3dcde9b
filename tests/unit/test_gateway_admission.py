"""The gateway's admission answers as the API does when the brake refuses
(discovery/gateway/identity.py): one shared brake, and its own words for why,
so a surge over many addresses is not reported as this address's guessing."""

from __future__ import annotations

import base64

from discovery.brake import SURGE_FAILURES, Brake
from discovery.gateway.identity import Admission, Refusal
from tests.support.brakes import Clock

TOKEN = "a-gateway-token-of-some-length"


def basic(username: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{username}:{password}".encode())


def test_a_surge_over_many_addresses_is_named_as_such_in_the_429() -> None:
    clock = Clock()
    admission = Admission(TOKEN, Brake(clock=clock))
    for n in range(SURGE_FAILURES + 10):  # one wrong token from each of many addresses
        answer = admission.admit(basic("crawler", "wrong"), f"10.0.{n >> 8}.{n & 255}")
        assert isinstance(answer, Refusal)
    refused = admission.admit(basic("crawler", TOKEN), "192.0.2.1")  # a new, unknown address
    assert isinstance(refused, Refusal)
    assert refused.status == 429 and refused.retry_after
    assert refused.detail.startswith("too many wrong tokens from many addresses")


def test_an_address_closed_for_its_own_guesses_is_named() -> None:
    clock = Clock()
    admission = Admission(TOKEN, Brake(clock=clock))
    for _ in range(10):
        admission.admit(basic("crawler", "wrong"), "192.0.2.7")
    refused = admission.admit(basic("crawler", "wrong"), "192.0.2.7")
    assert isinstance(refused, Refusal) and refused.status == 429
    assert refused.detail.startswith("too many wrong tokens from 192.0.2.7: no token is checked")
