"""What the fast tier may use (README, "Tests"), checked where a check is
cheap: a tests/unit module names none of the helpers that start a provider
process, a program under mocks, the Pulumi CLI, a service or a build, asks
for none of the fixtures of the testbed, the cluster, PostgreSQL, Chromium or
the client's wheel, and carries no mark of a slower tier. Read with `ast`:
names in code, not in strings (a pytester suite may name anything)."""

from __future__ import annotations

import ast

from tests.support.programs import ROOT

UNIT = ROOT / "tests" / "unit"

# Helpers that start a process that serves, a service, or a build.
STARTERS = frozenset(
    {
        "ProviderProcess",  # the provider process: tests/provider
        "run_program",  # a program under mocks in a subprocess: tests/program
        "CliStack",  # the Pulumi CLI: tests/engine
        "ServiceProcess",  # the discovery service as a process
        "PostgresServer",
        "private_postgres",
        "PrivateSshd",
        "RunningSquid",
        "start_squid",
        "tiny_image",  # scripts/build-test-image
        "proxy_image",  # scripts/build-proxy-image
        "apt_repo",  # scripts/build-apt-repo
        "build_dist",  # the client's wheel
        "make_venv",
        "run_kube",
        "run_testbed",
    }
)
FIXTURES = frozenset(
    {"testbed", "testbed_conn", "kube_cluster", "postgres", "browser", "client_dist", "client_venv"}
)
MARKS = frozenset({"integration", "pulumi_cli", "kubernetes"})


def outside_the_tier(source: str) -> list[str]:
    """What in SOURCE (a test module) belongs to a slower tier, one line each,
    in line order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in STARTERS:
            found.append((node.lineno, f"uses {node.id}"))
        elif isinstance(node, ast.Attribute) and node.attr in STARTERS:
            found.append((node.lineno, f"uses {node.attr}"))
        elif isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] in STARTERS:
            found.append((node.lineno, f"imports {node.name}"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [
                (node.lineno, f"{node.name} asks for the fixture {a.arg}")
                for a in args
                if a.arg in FIXTURES
            ]
        if (
            isinstance(node, ast.Attribute)
            and node.attr in MARKS
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
        ):
            found.append((node.lineno, f"marked {node.attr}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_no_unit_module_starts_what_a_slower_tier_needs() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(UNIT.glob("*.py"))
        if (lines := outside_the_tier(path.read_text()))
    }
    assert found == {}, "move these to the tier that may use them (README, Tests)"


def test_the_check_sees_each_kind() -> None:
    source = """
import pytest
from tests.harness.engine import ProviderProcess
from tests.support import squid

pytestmark = pytest.mark.integration

def test_a(testbed, tmp_path):
    with squid.start_squid(settings):
        pass

@pytest.mark.kubernetes
async def test_b(*, kube_cluster):
    run_program("x:main", {})

TEXT = "CliStack and testbed in a string are no use"
"""
    assert outside_the_tier(source) == [
        "line 3: imports ProviderProcess",
        "line 6: marked integration",
        "line 8: test_a asks for the fixture testbed",
        "line 9: uses start_squid",
        "line 12: marked kubernetes",
        "line 13: test_b asks for the fixture kube_cluster",
        "line 14: uses run_program",
    ]
