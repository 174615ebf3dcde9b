"""Reading the fleet: both file forms, `--stack` through pulumi, change detection,
and errors that never quote credentials."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from discovery.fleet import FleetError, FleetSource, parse_fleet
from discovery.targets import host_of
from tests.support.discovery import manifest, proxy_entry, write_fleet

SECRET = "s3cr3t-pw"


def test_manifest_and_stack_output_forms_read_alike(tmp_path: Path) -> None:
    entries = [
        proxy_entry("home-0", zone="nas1", labels={"site": "home"}, username="u", password=SECRET),
        proxy_entry("corp-1", port=8080),
    ]
    plain, outputs = tmp_path / "m.json", tmp_path / "o.json"
    write_fleet(plain, entries)
    write_fleet(outputs, entries, as_stack_output=True)
    a = FleetSource(path=plain).load()
    b = FleetSource(path=outputs).load()
    assert a == b
    assert list(a.proxies) == ["home-0", "corp-1"]
    home = a.proxies["home-0"]
    assert (home.zone, dict(home.labels), home.username) == ("nas1", {"site": "home"}, "u")
    assert home.url == f"http://u:{SECRET}@127.0.0.1:3128"
    assert a.proxies["corp-1"].url == "http://127.0.0.1:8080"
    assert SECRET not in repr(home)


def test_ipv6_hosts_are_bracketed_in_urls() -> None:
    fleet = parse_fleet(manifest([proxy_entry("v6", host="2001:db8::1", port=3128)]))
    assert fleet.proxies["v6"].url == "http://[2001:db8::1]:3128"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"version": 2, "project": "p", "stack": "s", "proxies": []}, "version"),
        (manifest([{**proxy_entry("a"), "port": "3128"}]), r"proxies.0 \(proxy 'a'\).port"),
        (manifest([{**proxy_entry("a"), "extra": 1}]), "extra"),
        (manifest([proxy_entry("a"), proxy_entry("a")]), "appears twice"),
        ({"fleet": {"version": 1}}, "project"),
    ],
)
def test_invalid_manifests_are_refused_with_the_place(document: object, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        parse_fleet(document)


def test_errors_never_quote_passwords(tmp_path: Path) -> None:
    bad = manifest([{**proxy_entry("a", username="u", password=SECRET), "port": 0}])
    path = tmp_path / "f.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(FleetError) as caught:
        FleetSource(path=path).load()
    assert SECRET not in str(caught.value)
    path.write_text('{"version": 1, "proxies": [' + SECRET)
    with pytest.raises(FleetError, match="not JSON") as caught:
        FleetSource(path=path).load()
    assert SECRET not in str(caught.value)


def test_a_file_counts_as_changed_only_after_a_successful_read(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    write_fleet(path, [proxy_entry("a")])
    source = FleetSource(path=path)
    assert source.changed()
    source.load()
    assert not source.changed()
    path.write_text('{"version": 1, "proj')  # caught half written
    assert source.changed()
    with pytest.raises(FleetError):
        source.load()
    assert source.changed()  # so the next poll reads it again
    write_fleet(path, [proxy_entry("a"), proxy_entry("b")])
    assert list(source.load().proxies) == ["a", "b"]
    assert not source.changed()
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert source.changed()


def _fake_pulumi(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir()
    exe = bin_dir / "pulumi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_stack_runs_pulumi_stack_output_without_the_service_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args_file, env_file = tmp_path / "args", tmp_path / "env"
    document = json.dumps(manifest([proxy_entry("a")]))
    _fake_pulumi(
        tmp_path / "bin",
        f'echo "$@" > {args_file}\nenv > {env_file}\ncat <<"EOF"\n{document}\nEOF\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("DISCOVERY_TOKEN", "tok-should-not-leak")
    source = FleetSource(stack="prod")
    assert list(source.load().proxies) == ["a"]
    assert args_file.read_text().split() == [
        "stack",
        "output",
        "fleet",
        "--json",
        "--show-secrets",
        "--stack",
        "prod",
        "--non-interactive",
    ]
    assert "tok-should-not-leak" not in env_file.read_text()
    assert source.changed()  # a stack is polled, not watched


def test_stack_errors_name_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pulumi(tmp_path / "bin", "echo \"error: no stack named 'prod' found\" >&2\nexit 255\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(FleetError, match="no stack named 'prod'"):
        FleetSource(stack="prod").load()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FleetError, match="pulumi CLI is not on PATH"):
        FleetSource(stack="prod").load()


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("example.com", "example.com"),
        ("Example.COM.", "example.com"),
        ("https://WWW.example.com:8443/a?b#c", "www.example.com"),
        ("example.com:443", "example.com"),
        ("http://user:pw@shop.example/x", "shop.example"),
        ("http://[2001:DB8::1]:80/", "2001:db8::1"),
        ("10.0.0.1", "10.0.0.1"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("http://x.example:65535/", "x.example"),  # the port is no business of a cooldown
        ("[::ffff:10.0.0.1]", "::ffff:a00:1"),
    ],
)
def test_targets_reduce_to_host_names(target: str, host: str) -> None:
    assert host_of(target) == host


@pytest.mark.parametrize(
    "target",
    ["", " ", "http://", "a b.com", "exa mple", "-bad-.com", "a..b", "bücher.example", "mailto:x"],
)
def test_bad_targets_are_refused(target: str) -> None:
    with pytest.raises(ValueError):
        host_of(target)
