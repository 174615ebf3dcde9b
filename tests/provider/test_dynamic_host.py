"""The project's dynamic-provider host (providers/dynamic_host.py): what it
relies on in the Pulumi SDK, and that it serves many calls at once."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pulumi.dynamic
import yaml
from pulumi.dynamic import CreateResult, ResourceProvider

from providers.dynamic_host import DEFAULT_WORKERS, WideExecutor
from tests.harness.engine import DYNAMIC_TYPE, ProviderProcess, provider_inputs

ROOT = Path(__file__).resolve().parents[2]


def test_the_sdk_builds_its_server_executor_as_the_host_expects() -> None:
    """pulumi/dynamic/__main__.py: main() calls futures.ThreadPoolExecutor(...)
    with `futures` imported from concurrent, looked up at call time. The host
    replaces concurrent.futures.ThreadPoolExecutor before running it."""
    source = Path(inspect.getfile(pulumi.dynamic)).with_name("__main__.py").read_text()
    tree = ast.parse(source)
    imports = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module == "concurrent"
        and any(alias.name == "futures" and alias.asname is None for alias in node.names)
    ]
    assert imports, "the SDK no longer does `from concurrent import futures`"
    [main] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    calls = [
        node
        for node in ast.walk(main)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "ThreadPoolExecutor"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "futures"
    ]
    assert len(calls) == 1, "main() no longer builds futures.ThreadPoolExecutor(...)"
    # And the module runs main() when executed as pulumi.dynamic's __main__.
    assert any(
        isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and ast.unparse(n.value) == "main()"
        for n in tree.body
    )


def test_the_wide_executor_never_has_fewer_workers() -> None:
    with WideExecutor(max_workers=4) as pool:
        assert pool._max_workers == DEFAULT_WORKERS
    with WideExecutor(max_workers=DEFAULT_WORKERS * 2) as pool:
        assert pool._max_workers == DEFAULT_WORKERS * 2


class Hold(ResourceProvider):
    """A create that waits until `count` creates have started (a barrier in
    the file system: one file per create), as ProxyDomain creates wait for
    their guests. With fewer workers than `count` it gives up after a while."""

    def create(self, props: Any) -> CreateResult:
        directory = Path(props["directory"])
        (directory / props["name"]).touch()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if len(list(directory.iterdir())) >= int(props["count"]):
                return CreateResult(id_=props["name"], outs={"together": True})
            time.sleep(0.02)
        return CreateResult(id_=props["name"], outs={"together": False})


def together(engine: ProviderProcess, directory: Path, count: int) -> list[bool]:
    """Whether each of `count` creates sent at once saw all of them running."""
    directory.mkdir()

    def create(index: int) -> bool:
        inputs = {"directory": str(directory), "count": count, "name": f"r{index}"}
        urn = f"urn:pulumi:t::t::{DYNAMIC_TYPE}::r{index}"
        return bool(engine.create(urn, provider_inputs(Hold(), inputs)).properties["together"])

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(create, range(count)))


def test_the_host_runs_sixteen_creates_at_once_where_the_sdk_runs_four(tmp_path: Path) -> None:
    with ProviderProcess() as host:  # the plugin script, scripts/pulumi-resource-pulumi-python
        assert all(together(host, tmp_path / "host", 16))
    with ProviderProcess(module="pulumi.dynamic") as sdk:  # what the host is for
        assert sum(together(sdk, tmp_path / "sdk", 8)) <= 4  # the first four waited in vain


def test_the_plugin_script_runs_the_host_from_the_virtualenv(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "pulumi-resource-pulumi-python"
    missing = subprocess.run(
        [str(script)],
        env={"PULUMI_RUNTIME_VIRTUALENV": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert missing.returncode == 1 and f"no Python in {tmp_path}" in missing.stderr
    # That it runs the host: the sixteen creates above went through this script
    # (ProviderProcess starts it by default, as the engine does).
    # The engine runs it as the project's plugin (Pulumi.yaml), not from PATH.
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["plugins"]["providers"] == [{"name": "pulumi-python", "path": "scripts"}]
    assert os.access(script, os.X_OK)
