"""The crawler client's rules, each stated once, as tables: the verdict on an
answer through a proxy (the httpx transports, the Scrapy middleware and the
gateway apply it), retry counting, the renewal schedule (alease() and the
pool run it), and the options with their defaults. How the adapters and the
loops apply them: tests/integration/test_client_shared_rules.py and
test_client_renewals.py."""

from __future__ import annotations

import ssl
from collections import Counter
from typing import Any

import anyio
import httpx
import pytest

from discovery.gateway import bans
from egress_proxies_client import BanPolicy, proxy_failed, verdict
from egress_proxies_client._leasing import FIRST_BACKOFF, MAX_BACKOFF, MIN_PAUSE, renew_pause
from egress_proxies_client._options import BLOCK_WAIT, DEFAULTS, Options, token_or_env
from egress_proxies_client._rotation import Rotation

CAPTCHA = BanPolicy(body_pattern="solve this captcha")
SQUID = {"x-squid-error": "ERR_CONNECT_FAIL 111"}


class BansEverything:
    def is_ban(self, status: int, headers: Any, body: bytes) -> bool:
        return True


@pytest.mark.parametrize(
    ("policy", "status", "headers", "body", "outcome"),
    [
        (BanPolicy(), 200, {}, b"", "ok"),
        (BanPolicy(), 404, {}, b"", "ok"),
        (BanPolicy(), 500, {}, b"", "ok"),
        (BanPolicy(), 403, {}, b"", "blocked"),
        (BanPolicy(), 429, {}, b"", "blocked"),
        (BanPolicy(), 503, {}, b"", "blocked"),
        (CAPTCHA, 200, {}, b"<p>please solve this captcha</p>", "blocked"),
        (CAPTCHA, 200, {}, b"<p>the page</p>", "ok"),
        # The proxy refused its credentials: its error, whatever the policy says.
        (BanPolicy(), 407, {}, b"", "error"),
        (BansEverything(), 407, {}, b"", "error"),
        # Squid's own error page: the site could not be reached, no ban.
        (BanPolicy(), 503, SQUID, b"", "ok"),
        (BanPolicy(), 503, httpx.Headers({"X-Squid-Error": "ERR_DNS_FAIL 0"}), b"", "ok"),
        (BansEverything(), 200, SQUID, b"", "ok"),
        (BansEverything(), 200, {}, b"", "blocked"),
    ],
)
def test_the_verdict_on_an_answer_through_a_proxy(
    policy: Any, status: int, headers: Any, body: bytes, outcome: str
) -> None:
    assert verdict(policy, status, headers, body) == outcome


def caused(error: BaseException, *causes: BaseException) -> BaseException:
    """`error`, raised from the first of `causes`, raised from the next...: a
    chain as httpx and Scrapy's handlers build them."""
    at = error
    for cause in causes:
        at.__cause__ = cause
        at = cause
    return error


# The errors httpx raised through a real squid (measured, December 5 2026).
@pytest.mark.parametrize(
    ("error", "failed"),
    [
        # No connection to the proxy itself.
        (caused(httpx.ConnectError("refused"), ConnectionRefusedError(111, "refused")), True),
        (caused(httpx.ConnectTimeout("timed out"), TimeoutError()), True),
        # The CONNECT refused: its credentials (the proxy's), or the site (its word on it).
        (httpx.ProxyError("407 Proxy Authentication Required"), True),
        (httpx.ProxyError("503 Service Unavailable"), False),
        (httpx.ProxyError("403 Forbidden"), False),
        # The site's TLS, inside the tunnel: a bad certificate, a handshake cut off.
        (caused(httpx.ConnectError("bad"), ssl.SSLCertVerificationError("verify failed")), False),
        (caused(httpx.ConnectError("eof"), anyio.EndOfStream(), ssl.SSLEOFError()), False),
        (caused(httpx.ConnectError("reset"), anyio.BrokenResourceError()), False),
        # No answer in time, a connection closed mid-answer.
        (caused(httpx.ReadTimeout("timed out"), TimeoutError()), False),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), False),
        (httpx.ReadError("reset"), False),
        # Scrapy's httpx handler wraps them: the chain still says.
        (caused(RuntimeError("DownloadConnectionRefusedError"), httpx.ProxyError("502 x")), False),
        (caused(RuntimeError("wrapped"), httpx.ConnectError("refused")), True),
        # No httpx error in the chain: the caller decides.
        (RuntimeError("twisted's own"), None),
    ],
)
def test_what_an_error_through_a_proxy_says_of_the_proxy(
    error: BaseException, failed: bool | None
) -> None:
    assert proxy_failed(error) is failed


def test_the_gateway_applies_the_clients_verdict_and_policy() -> None:
    assert bans.verdict is verdict
    assert bans.BanPolicy is BanPolicy


def test_retries_after_bad_answers_are_counted_up_to_the_limit() -> None:
    counts: Counter[str] = Counter()

    def count(key: str, n: int) -> None:
        counts[key] += n

    rotation = Rotation(None, BanPolicy(), ban_retries=2, count=count)  # type: ignore[arg-type]
    assert [rotation.again(tries) for tries in range(4)] == [True, True, False, False]
    assert counts == {"retries": 2, "retries/exhausted": 2}


@pytest.mark.parametrize(
    ("left", "failures", "pause"),
    [
        (60.0, 0, 20.0),  # a third of what is left
        (9.0, 0, 3.0),
        (0.3, 0, MIN_PAUSE),  # never sooner than MIN_PAUSE
        (-1.0, 0, MIN_PAUSE),
        (60.0, 1, FIRST_BACKOFF),  # after failures: doubling ...
        (60.0, 2, 2 * FIRST_BACKOFF),
        (60.0, 3, 4 * FIRST_BACKOFF),
        (60.0, 5, MAX_BACKOFF),  # ... up to MAX_BACKOFF
        (60.0, 40, MAX_BACKOFF),
        (1.5, 3, 0.5),  # ... and never past a third of what is left
        (0.3, 2, MIN_PAUSE),
    ],
)
def test_the_renewal_schedule(left: float, failures: int, pause: float) -> None:
    assert renew_pause(left, failures) == pytest.approx(pause)


def test_the_documented_defaults() -> None:
    assert (DEFAULTS.per_site, DEFAULTS.wait, DEFAULTS.idle, DEFAULTS.ban_retries) == (
        1,
        60.0,
        60.0,
        5,
    )
    assert DEFAULTS.ttl is None and DEFAULTS.token is None
    assert BLOCK_WAIT == 300.0  # alease(): one lease for a whole block waits longer


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"per_site": 0}, "per_site must be at least 1"),
        ({"ttl": 0}, "ttl must be positive"),
        ({"wait": -1}, "wait must not be negative"),
        ({"idle": -1}, "idle must not be negative"),
        ({"ban_retries": -1}, "ban_retries must not be negative"),
    ],
)
def test_options_out_of_range_are_refused(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Options(**given)


def test_options_are_picked_from_an_adapters_arguments() -> None:
    chosen = Options.of({"per_site": 3, "labels": {"k": "v"}, "holder": "h", "policy": None})
    assert (chosen.per_site, chosen.wait) == (3, DEFAULTS.wait)
    assert chosen.selector() == {"labels": {"k": "v"}}
    assert chosen.pool_settings()["per_site"] == 3


def test_the_token_comes_from_the_environment_only_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISCOVERY_TOKEN", "from-env")
    assert token_or_env(None) == "from-env"
    assert token_or_env("given") == "given"
    assert token_or_env("") == ""  # an empty token: none at all, not the environment's
    monkeypatch.delenv("DISCOVERY_TOKEN")
    assert token_or_env(None) is None
