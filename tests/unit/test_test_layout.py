"""Test modules import helpers, never one another: what more than one test
module uses lives in tests/support/ (or tests/harness/), so running, moving or
deleting one test file never changes another's.

A test module is a test_*.py file or a conftest.py. Checked with `ast` over
tests/ and bench/: imports (absolute and relative), and names of test modules
inside strings (a hook or program named "module:function" that a subprocess
imports, or code run with `python -c`). A test module may name itself in a
string (a program of its own for tests.harness.program.run_program is how the
harness is meant to be used), but not import itself, not even in code for
`python -c`: that runs the whole test module again in the subprocess.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from pathlib import Path

import pytest

from tests.support.programs import ROOT

SCANNED = ("tests", "bench")
# A dotted name inside a string that reaches into a test module.
_NAMED_IN_STRING = re.compile(r"\b(?:tests|bench)(?:\.\w+)*\.(?:test_\w+|conftest)\b")


def is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for each import in TREE; `from X import Y` counts as X.Y
    too, since Y may be a module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = importer.split(".")
                if not is_package:
                    package = package[:-1]
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def violations(source: str, importer: str, is_package: bool = False) -> list[str]:
    """What in SOURCE (the module IMPORTER) reaches into another test module;
    an import statement of itself counts too (a second copy of the module)."""
    tree = ast.parse(source)
    found = [
        f"line {line}: imports {module}"
        for line, module in imported_modules(tree, importer, is_package)
        if is_test_module(module)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [
                f"line {node.lineno}: names {match.group()} in a string"
                for match in _NAMED_IN_STRING.finditer(node.value)
                if match.group() != importer
            ]
            # Code for `python -c` that imports this very test module.
            found += [
                f"line {node.lineno}: code in a string imports {module}"
                for _, module in imported_modules(code_in(node.value), importer, is_package)
                if module == importer and is_test_module(module)
            ]
    return found


def code_in(text: str) -> ast.AST:
    """TEXT parsed as Python, or an empty module when it is not Python (or
    imports nothing: most strings, not worth parsing)."""
    empty = ast.Module(body=[], type_ignores=[])
    if "import" not in text:
        return empty
    try:
        with warnings.catch_warnings():  # prose parsed as code warns of odd escapes
            warnings.simplefilter("ignore")
            return ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return empty


def python_files() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py"))


def test_no_test_module_is_imported_by_another_module() -> None:
    problems = []
    for path in python_files():
        if path.resolve() == Path(__file__).resolve():
            continue  # the examples below are what it looks for
        found = violations(path.read_text(), module_name(path), path.name == "__init__.py")
        problems += [f"{path.relative_to(ROOT)}: {problem}" for problem in found]
    assert problems == [], "move what is shared into tests/support/:\n" + "\n".join(problems)


def test_the_scan_sees_the_test_modules() -> None:
    names = {module_name(p) for p in python_files()}
    assert "tests.unit.test_test_layout" in names
    assert "tests.support.squid" in names and "bench.health_probes" in names


@pytest.mark.parametrize(
    ("importer", "source"),
    [
        ("tests.integration.test_a", "from tests.integration.test_b import helper"),
        ("tests.integration.test_a", "from tests.program import test_b"),
        ("tests.integration.test_a", "import tests.unit.test_b as b"),
        ("tests.integration.test_a", "from .test_b import helper"),
        ("tests.integration.test_a", "from ..unit.test_b import helper"),
        ("tests.integration.test_a", "from tests.conftest import fixture"),
        ("tests.support.helpers", "from tests.unit.test_b import helper"),
        ("bench.probes", "from tests.harness.test_engine import helper"),
        ("tests.program.test_a", 'HOOK = "tests.program.test_b:mock_resource"'),
        ("tests.integration.test_a", 'SCRIPT = "from tests.integration.test_b import run"'),
        ("tests.integration.test_a", "from tests.integration.test_a import run"),
        ("tests.integration.test_a", 'SCRIPT = """\nfrom tests.integration.test_a import run\n"""'),
    ],
)
def test_an_import_of_a_test_module_is_found(importer: str, source: str) -> None:
    assert violations(source, importer) != []


@pytest.mark.parametrize(
    "source",
    [
        'PROGRAM = "tests.integration.test_a:program"',  # its own, for run_program
        "from tests.support.squid import squid_parse",
        "from tests.harness.program import run_program",
        "from tests.support import assert_golden",
        "from . import sibling_helper",
        "import pytest",
        '"""Proved by tests/integration/test_end_to_end.py."""',
    ],
)
def test_an_import_of_a_helper_is_fine(source: str) -> None:
    assert violations(source, "tests.integration.test_a") == []
