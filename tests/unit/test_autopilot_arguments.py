"""`python -m proxyinfra autopilot` refuses an argument that cannot work,
named with its value, before it reads or writes anything: exit status 2,
one line, no traceback, no lock or state file made."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyinfra.cli import main

RUN = ["--discovery", "http://127.0.0.1:9", "--once"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--stack", "../../etc", *RUN],
            "--stack '../../etc': not a stack name (letters, digits, '-', '_' and '.'; "
            "org/project/stack when qualified)",
        ),
        (
            ["pause", "--stack", "a/../b"],
            "--stack 'a/../b': not a stack name (letters, digits, '-', '_' and '.'; "
            "org/project/stack when qualified)",
        ),
        (
            ["--stack", "organization/other/dev", *RUN],
            "--stack 'organization/other/dev': names project 'other', "
            "but this project is 'egress-proxies'",
        ),
        (
            ["--stack", "dev", "--discovery", "127.0.0.1:8080", "--once"],
            "--discovery '127.0.0.1:8080': not an http:// or https:// URL with a host",
        ),
        (
            ["--stack", "dev", "--discovery", "http://", "--once"],
            "--discovery 'http://': not an http:// or https:// URL with a host",
        ),
        (
            ["--stack", "dev", "--discovery", "http://h:99999", "--once"],
            "--discovery 'http://h:99999': not an http:// or https:// URL with a host",
        ),
        (
            ["--stack", "dev", "--discovery", "https://ops:s3cret@discovery:8080/", "--once"],
            "--discovery 'https://***@discovery:8080/': credentials in the URL would reach the "
            "decision log; the service takes a bearer token, from $DISCOVERY_TOKEN",
        ),
        (["--stack", "dev", "--once"], "--discovery URL is required to run"),
        (
            ["--stack", "dev", *RUN, "--interval", "0"],
            "--interval 0: seconds between rounds, more than 0",
        ),
        (
            ["--stack", "dev", *RUN, "--interval", "inf"],
            "--interval inf: seconds between rounds, more than 0",
        ),
        (
            ["--stack", "dev", *RUN, "--retry-cap", "0"],
            "--retry-cap 0: failed updates of a change per hour, at least 1",
        ),
        (
            ["--stack", "dev", *RUN, "--lock-timeout", "-1"],
            "--lock-timeout -1: seconds, 0 or more",
        ),
        (["--stack", "dev", *RUN, "--listen", "8080"], "--listen '8080': not HOST:PORT"),
    ],
)
def test_a_bad_argument_is_named_and_nothing_is_made(
    args: list[str],
    error: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend = tmp_path / "state"
    backend.mkdir()
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{backend}")
    assert main(["--project-dir", str(tmp_path), "autopilot", *args]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"autopilot: {error}\n")
    assert sorted(tmp_path.rglob("*")) == [backend]


def test_a_log_that_cannot_be_opened_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}")
    (tmp_path / "file").write_text("")
    log = tmp_path / "file" / "decisions.log"  # under a file, not a directory
    code = main(
        ["--project-dir", str(tmp_path), "autopilot", "--stack", "dev", *RUN, "--log", str(log)]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        f"autopilot: --log {str(log)!r}: cannot be written (File exists: {log.parent})\n"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file"]
