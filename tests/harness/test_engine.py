"""The harness drives a real `python -m pulumi.dynamic` over gRPC, as the engine does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pulumi.runtime import rpc

from tests.harness.engine import (
    PROJECT_ROOT,
    PROVIDER_KEY,
    UNKNOWN,
    ProviderError,
    ProviderProcess,
    make_urn,
    provider_inputs,
)
from tests.harness.sample_provider import NoteProvider

URN = make_urn("note")


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderProcess]:
    with ProviderProcess() as process:
        yield process


def note(directory: Path, **props: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"directory": str(directory), "filename": "n.txt", "text": "hello"}
    return provider_inputs(NoteProvider(), {**base, **props})


def create(provider: ProviderProcess, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    checked = provider.check(URN, {}, inputs)
    assert checked.failures == []
    created = provider.create(URN, checked.inputs)
    return created.id, created.properties


def test_create_read_update_delete_round_trip(provider: ProviderProcess, tmp_path: Path) -> None:
    file = tmp_path / "n.txt"
    id_, outs = create(provider, note(tmp_path, text="v1", count=1))
    assert id_ == str(file)
    assert outs["path"] == str(file)
    assert json.loads(file.read_text()) == {"text": "v1", "count": 1.0}
    assert outs[PROVIDER_KEY] == note(tmp_path)[PROVIDER_KEY]  # the engine stores it as output

    file.write_text(json.dumps({"text": "drifted", "count": 9}))
    read = provider.read(id_, URN, outs)
    assert (read.id, read.properties["text"], read.properties["count"]) == (id_, "drifted", 9.0)

    news = provider.check(URN, outs, note(tmp_path, text="v2", count=2)).inputs
    assert provider.diff(id_, URN, outs, news).action == "update"
    updated = provider.update(id_, URN, outs, news)
    assert updated["text"] == "v2"
    assert json.loads(file.read_text()) == {"text": "v2", "count": 2.0}

    provider.delete(id_, URN, updated)
    assert not file.exists()
    assert provider.read(id_, URN, updated).id == ""  # gone: what a refresh would see
    log = provider.log_text()
    for line in (f"created {file}", f"updated {file}", f"deleted {file}"):
        assert f"note: {line}" in log


def test_numbers_arrive_as_floats(provider: ProviderProcess, tmp_path: Path) -> None:
    _, outs = create(provider, note(tmp_path, count=3))
    assert outs["count_type"] == "float"  # what the provider itself received
    assert outs["count"] == 3.0
    assert isinstance(outs["count"], float)
    assert provider.check(URN, {}, note(tmp_path, count=3)).inputs["count"] == 3.0


def test_create_error_comes_back_with_the_providers_message(
    provider: ProviderProcess, tmp_path: Path
) -> None:
    with pytest.raises(ProviderError) as caught:
        provider.create(URN, note(tmp_path, fail="disk full: /var/lib/libvirt"))
    assert caught.value.message == "disk full: /var/lib/libvirt"
    assert caught.value.exception_type == "tests.harness.sample_provider.NoteError"
    assert caught.value.method == "Create"
    assert "Traceback" in caught.value.details
    assert list(tmp_path.iterdir()) == []
    create(provider, note(tmp_path))  # the server is still serving
    assert provider.running


def test_check_reports_failures(provider: ProviderProcess, tmp_path: Path) -> None:
    inputs = note(tmp_path)
    del inputs["text"]
    assert provider.check(URN, {}, inputs).failures == [("text", "text is required")]


def test_diff_replace_versus_update(provider: ProviderProcess, tmp_path: Path) -> None:
    id_, outs = create(provider, note(tmp_path, text="a", count=1))
    renamed = provider.diff(id_, URN, outs, note(tmp_path, filename="m.txt", text="b"))
    assert (renamed.action, renamed.replaces, renamed.changes) == ("replace", ["filename"], "some")
    edited = provider.diff(id_, URN, outs, note(tmp_path, text="b", count=1))
    assert (edited.action, edited.replaces) == ("update", [])
    same = provider.diff(id_, URN, outs, note(tmp_path, text="a", count=1))
    assert (same.action, same.changes) == ("same", "none")


def test_unknown_values_during_preview(provider: ProviderProcess, tmp_path: Path) -> None:
    checked = provider.check(URN, {}, note(tmp_path, text=UNKNOWN))
    assert checked.failures == []
    assert checked.inputs["text"] == UNKNOWN  # the provider saw an Unknown and kept it

    id_, outs = create(provider, note(tmp_path, text="known"))
    assert provider.diff(id_, URN, outs, note(tmp_path, text=UNKNOWN)).action == "update"
    assert provider.diff(id_, URN, outs, note(tmp_path, filename=UNKNOWN)).replaces == ["filename"]

    # The Python dynamic provider does not support preview: the engine never calls
    # Create/Update with preview=True, it takes the inputs as the planned state.
    assert provider.supports_preview is False
    planned = provider.create(URN, note(tmp_path / "sub", text=UNKNOWN), preview=True)
    assert (planned.id, planned.properties["text"]) == ("", UNKNOWN)
    assert not (tmp_path / "sub").exists()
    assert (
        provider.update(id_, URN, outs, note(tmp_path, text=UNKNOWN), preview=True)["text"]
        == UNKNOWN
    )
    assert json.loads((tmp_path / "n.txt").read_text())["text"] == "known"
    with pytest.raises(ValueError, match="outside a preview"):
        provider.create(URN, note(tmp_path, text=UNKNOWN))


def test_secrets_are_unwrapped_before_sending(provider: ProviderProcess, tmp_path: Path) -> None:
    assert provider.accept_secrets is False
    secret_provider = rpc.wrap_rpc_secret(note(tmp_path)[PROVIDER_KEY])  # as dynamic.Resource
    inputs = {**note(tmp_path, text=rpc.wrap_rpc_secret("s3cret")), PROVIDER_KEY: secret_provider}
    _, outs = create(provider, inputs)
    assert outs["text"] == "s3cret"
    assert json.loads((tmp_path / "n.txt").read_text())["text"] == "s3cret"


def test_provider_imports_the_project_only_through_its_working_directory(
    provider: ProviderProcess, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with ProviderProcess(cwd=elsewhere) as stranger, pytest.raises(ProviderError) as caught:
        stranger.check(URN, {}, note(tmp_path))
    assert caught.value.exception_type == "ModuleNotFoundError"
    assert caught.value.message == "No module named 'tests'"
    assert provider.check(URN, {}, note(tmp_path)).failures == []  # from the project root


def test_stack_config_reaches_the_provider_through_configure(tmp_path: Path) -> None:
    with ProviderProcess(config={"egress-proxies:stamp": "build-7"}) as configured:
        _, outs = create(configured, note(tmp_path))
    assert outs["stamp"] == "build-7"


def test_close_terminates_the_server(tmp_path: Path) -> None:
    process = ProviderProcess(log_path=tmp_path / "p.log").start()
    assert process.running and process.port
    process.close()
    assert not process.running
    with pytest.raises(RuntimeError, match="not running"):
        process.check(URN, {}, note(tmp_path))


def test_server_dies_with_the_process_that_started_it() -> None:
    # A test process killed mid-run must not leave servers behind: they never exit alone.
    script = (
        "import os\nfrom tests.harness.engine import ProviderProcess\n"
        "print(ProviderProcess().start().pid, flush=True)\nos._exit(0)\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60
    )
    pid = int(started.stdout)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only nobody reaped it yet
