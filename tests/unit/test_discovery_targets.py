"""Crawl targets (discovery/targets.py): what is accepted, what is refused and
how a refusal is worded; and the request schemas that check them."""

from __future__ import annotations

import ipaddress
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from discovery.schemas import LeaseRequest, ReportRequest
from discovery.targets import TARGET_PATTERN, host_of, problem


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("example.com", "example.com"),
        ("Example.COM.", "example.com"),
        ("localhost", "localhost"),
        ("localhost:65535", "localhost"),
        ("shop.example:1", "shop.example"),
        ("https://WWW.example.com:8443/a?b#c", "www.example.com"),
        ("http://user:pw@shop.example/x", "shop.example"),
        ("_dmarc.example.com", "_dmarc.example.com"),
        ("3com.example", "3com.example"),
        ("1.2.3.4.example", "1.2.3.4.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("a" * 63 + ".example", "a" * 63 + ".example"),
        (".".join(["a" * 63] * 3 + ["b" * 61]), ".".join(["a" * 63] * 3 + ["b" * 61])),
        ("10.0.0.1", "10.0.0.1"),
        ("255.255.255.255:80", "255.255.255.255"),
        ("http://0.0.0.0/", "0.0.0.0"),
        ("[2001:DB8::1]", "2001:db8::1"),
        ("http://[2001:db8::1]:80/", "2001:db8::1"),
        ("[::]", "::"),
        ("[::1]:8080", "::1"),
        ("[1:2:3:4:5:6:7:8]", "1:2:3:4:5:6:7:8"),
        ("[1:2:3:4:5:6:7::]", "1:2:3:4:5:6:7:0"),
        ("[::ffff:10.0.0.1]", str(ipaddress.ip_address("::ffff:10.0.0.1"))),
        ("[64:ff9b::192.0.2.33]", "64:ff9b::c000:221"),
    ],
)
def test_urls_host_names_and_addresses_are_accepted(target: str, host: str) -> None:
    assert problem(target) is None
    assert host_of(target) == host


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("", "empty"),
        ("a b.com", "white space"),
        ("example.com\n", "white space"),
        ("bücher.example", "xn--"),
        ("http://", "no host"),
        ("[:::::]", "not an IPv6 address"),
        ("[1:2:3:4:5:6:7:8:9]", "not an IPv6 address"),
        ("[12345::1]", "not an IPv6 address"),
        ("[::1", "not an IPv6 address"),
        ("[example.com]", "not an IPv6 address"),
        ("example.com:0", "port"),
        ("example.com:99999", "port"),
        ("http://example.com:65536/", "port"),
        ("example.com:", "port"),
        ("example.com:08080", "port"),
        ("mailto:x", "port"),
        ("1.2.3.999", "not an IPv4 address"),
        ("1.2.3.04", "not an IPv4 address"),
        ("1.2.3", "not an IPv4 address"),
        ("1.2.3.4.", "trailing dot"),
        ("a" * 2000, "longer than 253"),
        ("a" * 2000 + ".example", "longer than 253"),
        (".".join(["a"] * 200), "longer than 253"),
        ("a" * 64 + ".example", "longer than 63"),
        ("-bad-.com", "'-'"),
        ("a..b", "empty label"),
        ("exa%mple.com", "characters other than"),
        ("a.123", "does not begin with a letter"),
        ("0x7f.1", "does not begin with a letter"),
    ],
)
def test_bad_targets_are_refused_with_a_short_reason(target: str, reason: str) -> None:
    found = problem(target)
    assert found is not None and reason in found, found
    with pytest.raises(ValueError) as refused:
        host_of(target)
    message = str(refused.value)
    assert reason in message
    assert len(message) < 150, message
    assert "(?:" not in message


def test_the_host_name_limit_is_253_characters() -> None:
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(longest) == 253
    assert problem(longest) is None and problem(longest + ".") is None
    assert problem(longest + "b") is not None


@given(st.ip_addresses(v=6))
@settings(max_examples=300)
def test_every_ipv6_spelling_is_accepted(address: ipaddress.IPv6Address) -> None:
    for text in (str(address), address.exploded):
        assert host_of(f"[{text}]") == str(address)
        assert host_of(f"http://[{text}]:443/") == str(address)


@given(st.text(alphabet="0123456789abcdefABCDEF:.", min_size=1, max_size=45))
@settings(max_examples=1000)
def test_brackets_hold_exactly_what_is_an_ipv6_address(text: str) -> None:
    try:
        expected: str | None = str(ipaddress.IPv6Address(text))
    except ValueError:
        expected = None
    assert (problem(f"[{text}]") is None) == (expected is not None)
    if expected is not None:
        assert host_of(f"[{text}]") == expected


@given(st.from_regex(TARGET_PATTERN, fullmatch=True))
@settings(max_examples=500)
def test_what_the_published_pattern_allows_is_accepted(target: str) -> None:
    # The OpenAPI document's pattern: what it calls valid, the service accepts
    # (hosts longer than 253 characters aside, which a pattern cannot say well).
    reason = problem(target)
    assert reason is None or "longer than 253" in reason


@pytest.mark.parametrize("target", ["[:::::]", "x.example:0", "x.example:99999", "1.2.3.999"])
def test_the_request_schemas_refuse_bad_targets_without_quoting_the_pattern(target: str) -> None:
    for model, body in (
        (LeaseRequest, {"holder": "c", "target": target}),
        (ReportRequest, {"outcome": "blocked", "target": target}),
    ):
        with pytest.raises(ValidationError) as refused:
            model.model_validate_json(json.dumps(body))
        (error,) = refused.value.errors(include_input=False, include_url=False)
        assert error["loc"] == ("target",)
        assert error["msg"] == problem(target)
        assert len(error["msg"]) < 100 and "(?:" not in error["msg"]
    assert LeaseRequest.model_validate_json(json.dumps({"holder": "c", "target": "a.example:1"}))


def test_the_schema_publishes_the_pattern() -> None:
    schema = LeaseRequest.model_json_schema(by_alias=True)["properties"]["target"]
    (string,) = [s for s in schema["anyOf"] if s.get("type") == "string"]
    assert string["pattern"] == TARGET_PATTERN
    re.compile(TARGET_PATTERN)
