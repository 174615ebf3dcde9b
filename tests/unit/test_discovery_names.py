"""The one rule for names that reach logs, pages and stores
(proxyinfra/printable.py; issue 39, findings 6, 7 and 10), rule by rule: its
table is Unicode's, its JSON Schema pattern says the same, and every place a
name comes in holds to it: the fleet manifest (a refusal names the proxy),
several stacks' qualified names, the lease API's holders and selectors, the
gateway's username, the stack config's labels."""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from discovery.fleet import FleetError, FleetSource, parse_fleet
from discovery.gateway.identity import BadUsername, parse_username
from discovery.hotpath import describe
from discovery.schemas import GatewayReportRequest, LeaseRequest
from discovery.sources import FleetSources
from proxyinfra.config import ProxyEntry
from proxyinfra.printable import (
    MAX_NAME,
    PATTERN,
    REFUSED_CATEGORIES,
    REFUSED_RANGES,
    SURROGATES,
    refused_character,
)
from tests.support.discovery import manifest, proxy_entry

REFUSED = {
    "\x00": "U+0000 (a control character)",
    "\t": "U+0009 (a control character)",
    "\x85": "U+0085 (a control character)",
    "\u00ad": "U+00AD (a format character)",
    "\u200b": "U+200B (a format character)",
    "\u202e": "U+202E (a format character)",
    "\u2066": "U+2066 (a format character)",
    "\u2028": "U+2028 (a line separator)",
    "\u2029": "U+2029 (a paragraph separator)",
    "\ufeff": "U+FEFF (a format character)",
    "\ud800": "U+D800 (a surrogate)",
    "\U000e0041": "U+E0041 (a format character)",
}
ACCEPTED = ["home-0", "crawler 7", "bücher", "東京-1", "a/b", "x\u00a0y", "🦀", "é" * MAX_NAME]


# -- the rule ---------------------------------------------------------------------------------


def test_the_table_is_unicodes_categories_on_this_python() -> None:
    """The ranges are written out; a Python with other Unicode tables says so here."""
    table = {code for low, high in REFUSED_RANGES for code in range(low, high + 1)}
    categories = set(REFUSED_CATEGORIES)
    unicode = {c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in categories}
    assert table == unicode, f"Unicode {unicodedata.unidata_version}: update REFUSED_RANGES"


@pytest.mark.parametrize("character", list(REFUSED), ids=lambda c: f"U+{ord(c):04X}")
def test_a_refused_character_is_named_wherever_it_stands(character: str) -> None:
    for value in (character, f"a{character}", f"crawler{character}7"):
        assert refused_character(value) == REFUSED[character]
    assert not re.fullmatch(PATTERN, f"a{character}b") or character == "\ud800"


@pytest.mark.parametrize("value", ACCEPTED)
def test_letters_of_any_script_spaces_and_symbols_are_names(value: str) -> None:
    assert refused_character(value) is None
    assert re.fullmatch(PATTERN, value)


def test_the_pattern_refuses_exactly_the_table_but_surrogates() -> None:
    """No JSON Schema string holds a surrogate (parse_fleet names one apart)."""
    edges = {c for low, high in REFUSED_RANGES for c in (low - 1, low, high, high + 1)}
    for code in sorted(edges & set(range(sys.maxunicode + 1))):
        character = chr(code)
        refused = refused_character(character) is not None
        surrogate = SURROGATES[0] <= code <= SURROGATES[1]
        assert (re.fullmatch(PATTERN, character) is None) == (refused and not surrogate)


# -- the manifest (finding 6): refused before any store sees it, naming the proxy ----------


def named(name: str, **fields: Any) -> dict[str, Any]:
    return {**proxy_entry("x", **fields), "name": name}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (named("p" * 3000), "proxies.1 (proxy 'pppppppppppppppppppppppppppppppp...').name: "),
        (named("p" * (MAX_NAME + 1)), "at most 256 characters"),
        (named("p\x00x"), "proxies.1 (proxy 'p\\x00x').name: U+0000 (a control character)"),
        (named("p\x85x"), "proxies.1 (proxy 'p\\x85x').name: U+0085"),
        (named("p\u202ex"), "proxies.1 (proxy 'p\\u202ex').name: U+202E (a format character)"),
        (named("p\u2028x"), "proxies.1 (proxy 'p\\u2028x').name: U+2028 (a line separator)"),
        (named("p\ud800x"), "proxies.1 (proxy 'p\\ud800x').name: 'p\\ud800x' holds U+D800"),
        (named("p-z", zone="z\x00"), "proxies.1 (proxy 'p-z').zone: U+0000"),
        (named("p-c", provider="c\u2066"), "proxies.1 (proxy 'p-c').provider: U+2066"),
        (named("p-l", labels={"site": "a\u2029"}), "proxies.1 (proxy 'p-l').labels.site: U+2029"),
        (named("p-k", labels={"s\u202e": "a"}), "(proxy 'p-k').labels.'s\\u202e'.[key]: U+202E"),
        (named("p-s", labels={"s\udc00": "a"}), "(proxy 'p-s').labels: 's\\udc00' holds U+DC00"),
    ],
)
def test_a_name_no_log_page_or_store_can_keep_makes_the_manifest_invalid(
    entry: dict[str, Any], message: str
) -> None:
    document = json.loads(json.dumps(manifest([proxy_entry("good"), entry])))
    with pytest.raises(FleetError) as refused:
        parse_fleet(document)
    assert str(refused.value).startswith("not a valid fleet manifest v1: ")
    assert message in str(refused.value)
    if len(entry["name"]) > 40:
        assert len(str(refused.value)) < 300  # a long name is cut short, not repeated


def test_names_the_rule_allows_are_served_as_given() -> None:
    entries = [named(name, labels={"k": name}) for name in ACCEPTED]
    entries = [{**e, "id": f"proxy-{i:010x}"} for i, e in enumerate(entries)]
    fleet = parse_fleet(manifest(entries))
    assert list(fleet.proxies) == ACCEPTED


@pytest.mark.parametrize(
    ("field", "value"),
    [("stack", "a/b"), ("stack", "x" * 101), ("project", "p\x00"), ("stack", "")],
)
def test_project_and_stack_are_pulumi_names(field: str, value: str) -> None:
    with pytest.raises(FleetError, match=rf"{field}: .* is no Pulumi name"):
        parse_fleet({**manifest([proxy_entry("a")]), field: value})


def test_a_file_refused_for_a_name_says_where_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(manifest([named("p\x00")])))
    with pytest.raises(FleetError, match=rf"^{re.escape(str(path))}: not a valid .*'p\\x00'"):
        FleetSource(path=path).load()


# -- several stacks (finding 7) ----------------------------------------------------------------


def write_stack(path: Path, stack: str, names: list[str]) -> None:
    entries = [{**named(n), "id": f"proxy-{i:010x}"} for i, n in enumerate(names)]
    path.write_text(json.dumps({**manifest(entries), "stack": stack}))


def test_stacks_whose_qualified_names_would_collide_are_refused_naming_the_stack(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_stack(a, "a", ["b/c", "d"])
    write_stack(b, "a/b", ["c"])
    both = FleetSources([FleetSource(path=a), FleetSource(path=b)], file_poll=1, stack_refresh=60)
    with pytest.raises(FleetError, match=rf"^file {re.escape(str(b))}: .*stack: 'a/b' is no"):
        both.load()
    write_stack(b, "ab", ["c"])
    assert list(both.load().proxies) == ["a/b/c", "a/d", "ab/c"]


# -- the API and the gateway (finding 10) ----------------------------------------------------


# No JSON text holds a lone surrogate: such a body is refused as not JSON.
@pytest.mark.parametrize(
    "character", [c for c in REFUSED if c != "\ud800"], ids=lambda c: f"U+{ord(c):04X}"
)
@pytest.mark.parametrize(
    ("model", "body", "where"),
    [
        (LeaseRequest, {"holder": "h{c}"}, "holder"),
        (LeaseRequest, {"holder": "h", "selector": {"provider": "{c}"}}, "selector.provider"),
        (LeaseRequest, {"holder": "h", "selector": {"zone": "z{c}"}}, "selector.zone"),
        (LeaseRequest, {"holder": "h", "selector": {"labels": {"k": "{c}"}}}, "selector.labels.k"),
        (
            GatewayReportRequest,
            {"holder": "h{c}", "session": "s", "outcome": "ok"},
            "holder",
        ),
    ],
)
def test_a_request_with_a_refused_character_is_refused_naming_the_field(
    model: type[BaseModel], body: dict[str, Any], where: str, character: str
) -> None:
    raw = json.dumps(body).replace("{c}", json.dumps(character)[1:-1])
    with pytest.raises(ValidationError) as refused:
        model.model_validate_json(raw)
    assert f"{where}: {REFUSED[character]}" in describe(refused.value)


def test_holders_are_names_up_to_256_characters() -> None:
    assert LeaseRequest.model_validate({"holder": "h" * MAX_NAME}).holder == "h" * MAX_NAME
    assert LeaseRequest.model_validate({"holder": "crawler ü 7"}).holder == "crawler ü 7"
    with pytest.raises(ValidationError, match="at most 256 characters"):
        LeaseRequest.model_validate({"holder": "h" * (MAX_NAME + 1)})


@pytest.mark.parametrize("character", ["\x85", "\u202e", "\u2028", "\x00", "\u200b"])
def test_the_gateways_username_holds_to_the_same_rule(character: str) -> None:
    for username, part in [
        (f"c{character}", "holder"),
        (f"c-zone-z{character}", "-zone-"),
        (f"c-provider-{character}", "-provider-"),
        (f"c-label-k=v{character}", "-label-"),
    ]:
        with pytest.raises(BadUsername, match=re.escape(part)) as refused:
            parse_username(username)
        assert f"U+{ord(character):04X}" in str(refused.value)
    assert parse_username("crawler ü-zone-東京").selector.zone == "東京"


def test_the_stack_configs_label_values_hold_to_the_rule_before_pulumi_up() -> None:
    entry = {"name": "home", "provider": "kvm-home"}
    assert ProxyEntry.model_validate({**entry, "labels": {"site": "ü x"}}).labels == {"site": "ü x"}
    with pytest.raises(ValidationError, match=r"labels\.site\n.*U\+202E"):
        ProxyEntry.model_validate({**entry, "labels": {"site": "a\u202eb"}})
