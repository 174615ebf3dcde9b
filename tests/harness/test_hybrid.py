"""Whole programs under mocks; in hybrid mode the dynamic resources really run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.engine import DYNAMIC_TYPE, PROVIDER_KEY
from tests.harness.program import run_program

NOTES = "tests.harness.sample_program:notes"


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_hybrid_up_creates_for_real_and_destroy_deletes_newest_first(tmp_path: Path) -> None:
    notes_dir = tmp_path / "notes"
    notes_dir.mkdir()
    state_file = tmp_path / "state.json"
    config = {"dir": str(notes_dir), "secretText": "s3cret", "count": 7, "stamp": "run-1"}

    up = run_program(
        NOTES, config, hybrid=True, state_file=state_file, secret_config=["secretText"]
    ).raise_for_error()

    assert files(notes_dir) == ["extra.txt", "first.txt", "second.txt"]
    second = json.loads((notes_dir / "second.txt").read_text())
    assert second["text"] == "after first.txt"  # computed from first's real output
    assert up.output("firstPath") == str(notes_dir / "first.txt")
    assert up.output("secondText") == "after first.txt"
    assert up.output("countType") == "float"
    assert up.output("files") == ["first.txt", "second.txt", "extra.txt"]
    assert up.output("extraText") == "s3cret"
    assert up.is_secret("extraText") and not up.is_secret("firstPath")

    book = up.resource("book")
    assert (book.type, book.custom) == ("egress:test:Notebook", False)
    first, second_res, extra = (up.resource(n, DYNAMIC_TYPE) for n in ("first", "second", "extra"))
    assert [r.name for r in up.children_of(book)] == ["first", "second"]
    assert first.id == str(notes_dir / "first.txt")  # the real id, not a mock's
    assert first.outputs["stamp"] == "run-1"  # stack config reached the provider
    assert extra.secret_inputs == ["text"] and extra.secret_outputs == ["text"]
    assert PROVIDER_KEY not in first.inputs

    assert up.created.index(first.urn) < up.created.index(second_res.urn)
    saved = json.loads(state_file.read_text())["resources"]
    assert [r["urn"] for r in saved] == up.created
    assert all(r["inputs"][PROVIDER_KEY] for r in saved)  # enough to delete without the program
    assert up.provider_log.count("note: created") == 3

    down = run_program("", {}, mode="destroy", state_file=state_file).raise_for_error()
    assert down.deleted == list(reversed(up.created))
    assert files(notes_dir) == []
    assert json.loads(state_file.read_text())["resources"] == []
    assert down.provider_log.count("note: deleted") == 3


def test_hybrid_failed_create_reports_the_message_and_up_destroy_cleans_up(
    tmp_path: Path,
) -> None:
    config = {"dir": str(tmp_path), "secretText": "x", "count": 1, "failText": "disk full"}

    result = run_program(NOTES, config, hybrid=True, mode="up-destroy")

    assert result.error is not None and "NoteError: disk full" in result.error.message
    assert result.resource("broken").error is not None
    assert "disk full" in (result.resource("broken").error or "")
    assert len(result.created) == 3  # everything but the broken note was created ...
    assert result.deleted == list(reversed(result.created))  # ... and deleted again
    assert result.destroy_error is None
    assert files(tmp_path) == []


def test_plain_run_records_resources_and_outputs(tmp_path: Path) -> None:
    result = run_program(
        "tests.harness.sample_program:things",
        {"labels": {"site": "home", "tier": 2}, "dir": str(tmp_path)},
        new_resource_hook="tests.harness.sample_program:add_address",
        call_hook="tests.harness.sample_program:get_zone",
    ).raise_for_error()

    assert sorted(result.names()) == ["db", "group", "note", "web"]
    group = result.resource("group")
    web, db = result.resource("web"), result.resource("db")
    assert {r.name for r in result.resources_of_type("egress:test:Thing")} == {"web", "db"}
    assert web.parent == db.parent == group.urn
    assert web.urn == "urn:pulumi:dev::egress-proxies::egress:test:Group$egress:test:Thing::web"
    assert web.inputs == {"size": 2.0, "labels": {"site": "home", "tier": 2.0}}
    assert (web.id, web.outputs["address"]) == ("web-custom-id", "10.0.0.2")  # the hook
    assert db.inputs["peer"] == "web-custom-id"

    mocked = result.resource("note", DYNAMIC_TYPE)
    assert mocked.id == "note-id" and "path" not in mocked.outputs
    assert files(tmp_path) == []  # the provider never ran
    assert result.created == [] and result.provider_log == ""

    assert result.outputs == {
        "exported": "via pulumi.export",
        "webId": "web-custom-id",
        "dbPeer": "see resources",
        "labels": {"site": "home", "tier": 2},  # structured config arrived as JSON
        "token": "t0ken",
        "zone": {"zone": "NAS1"},
    }
    assert result.secret_outputs == ["token"]


def test_run_error_yields_exactly_its_message() -> None:
    result = run_program("tests.harness.sample_program:fails", {})
    assert result.error is not None
    assert (
        result.error.message == "fleet config is invalid:\n- proxies[0].provider: unknown 'kvm-x'"
    )
    assert result.error.type == "RunError"
    assert result.resources == [] and result.outputs == {}
    with pytest.raises(AssertionError, match="fleet config is invalid"):
        result.raise_for_error()


def test_up_refuses_a_state_file_that_still_holds_resources(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps({"resources": [{"urn": "u", "id": "i"}]}))
    with pytest.raises(ValueError, match="destroy them first"):
        run_program(NOTES, {}, hybrid=True, state_file=state_file)
    with pytest.raises(ValueError, match="needs the state_file"):
        run_program(NOTES, {}, mode="destroy")
