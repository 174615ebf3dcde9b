"""The autopilot leaves no backend salt in the project's stack file
(proxyinfra/autopilot/saltless.py): a salt line the CLI wrote into a file
that had none is taken out, a file's own salt is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyinfra.autopilot.saltless import FALLBACK, drop_salt, fallback_env, keeping_saltless

BODY = "config:\n  egress-proxies:generations:\n    home-0: 2\n"
SALT = "encryptionsalt: v1:abc=:v1:def:ghi==\n"


def cli_writes_salt(path: Path) -> str:
    """What `pulumi config set` does to a passphrase stack's file without one."""
    path.write_text(path.read_text() + SALT)
    return "done"


def test_a_salt_written_into_a_file_without_one_is_taken_out(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.lab.yaml"
    stack.write_text(BODY)
    stack.chmod(0o640)
    assert keeping_saltless(stack, lambda: cli_writes_salt(stack)) == "done"
    assert stack.read_text() == BODY
    assert stack.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["Pulumi.lab.yaml"]


def test_even_when_the_command_fails(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.lab.yaml"
    stack.write_text(BODY)

    def fails() -> None:
        cli_writes_salt(stack)
        raise RuntimeError("update failed")

    with pytest.raises(RuntimeError):
        keeping_saltless(stack, fails)
    assert stack.read_text() == BODY


def test_a_files_own_salt_is_kept(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.lab.yaml"
    stack.write_text(SALT + BODY)
    keeping_saltless(stack, lambda: stack.write_text(SALT + BODY + "  more: 1\n"))
    assert stack.read_text() == SALT + BODY + "  more: 1\n"


def test_a_nested_key_named_like_the_salt_is_not_the_salt(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.lab.yaml"
    text = "config:\n  encryptionsalt: not-a-top-level-key\n"
    stack.write_text(text)
    drop_salt(stack)
    drop_salt(tmp_path / "missing.yaml")
    assert stack.read_text() == text


def test_the_cli_falls_back_to_the_states_salt_unless_the_operator_said() -> None:
    assert fallback_env({}) == {FALLBACK: "true"}
    assert fallback_env({FALLBACK: "false"}) == {}
