"""The suite's own order (tests/conftest.py): the tests of the real Pulumi CLI
run last, so that on a new machine everything else runs while the CLI builds,
and a test that runs the CLI without saying so fails on every machine."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.programs import ROOT

pytest_plugins = ["pytester"]

# Pytester gives its runs a HOME of their own: the CLI's cache is below the real one.
HOME = os.environ["HOME"]


def suite(pytester: pytest.Pytester, files: dict[str, str]) -> pytest.RunResult:
    """Runs FILES as a test suite of their own under the project's conftest."""
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makeini(
        "[pytest]\nmarkers =\n    pulumi_cli: runs the CLI\n    kubernetes: needs the cluster\n"
    )
    pytester.makepyfile(**files)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(ROOT))
        patch.setenv("HOME", HOME)
        patch.setenv("EGRESS_PROXIES_CLI_GATE", "true")  # no wait for a real build
        patch.setenv("EGRESS_PROXIES_KUBE_GATE", "true")
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")


def test_the_tests_of_the_cli_run_after_every_other_test(pytester: pytest.Pytester) -> None:
    result = suite(
        pytester,
        {
            "test_a_engine": (
                "import pytest\n"
                "pytestmark = pytest.mark.pulumi_cli\n"
                "def test_one(): pass\n"
                "def test_two(): pass\n"
            ),
            "test_b_unit": "def test_three(): pass\ndef test_four(): pass\n",
        },
    )
    result.assert_outcomes(passed=4)
    ran = [line.split(" ")[0] for line in result.outlines if " PASSED" in line]
    assert ran == [
        "test_b_unit.py::test_three",
        "test_b_unit.py::test_four",
        "test_a_engine.py::test_one",
        "test_a_engine.py::test_two",
    ]


def test_the_tests_on_the_cluster_run_after_those_of_the_cli(pytester: pytest.Pytester) -> None:
    result = suite(
        pytester,
        {
            "test_a_kube": (
                "import pytest\n"
                "pytestmark = [pytest.mark.pulumi_cli, pytest.mark.kubernetes]\n"
                "def test_pods(): pass\n"
            ),
            "test_b_engine": "import pytest\n@pytest.mark.pulumi_cli\ndef test_up(): pass\n",
            "test_c_unit": "def test_unit(): pass\n",
        },
    )
    result.assert_outcomes(passed=3)
    ran = [line.split(" ")[0] for line in result.outlines if " PASSED" in line]
    assert ran == [
        "test_c_unit.py::test_unit",
        "test_b_engine.py::test_up",
        "test_a_kube.py::test_pods",
    ]


def test_a_failed_kubernetes_build_fails_only_the_tests_that_need_it(
    pytester: pytest.Pytester,
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EGRESS_PROXIES_KUBE_GATE", "test -e /no-such-build")
        pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
        pytester.makeini("[pytest]\nmarkers =\n    pulumi_cli: x\n    kubernetes: y\n")
        pytester.makepyfile(
            test_k="import pytest\n@pytest.mark.kubernetes\ndef test_pods(): pass\n"
            "def test_unit(): pass\n"
        )
        patch.setenv("PYTHONPATH", str(ROOT))
        patch.setenv("HOME", HOME)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test -e /no-such-build failed after*"])


@pytest.fixture
def real_looking_cli() -> Iterator[Path]:
    """A `pulumi` outside the temporary directories, as a real one is (a
    stand-in a test writes to /tmp does not count as the CLI)."""
    # One directory per worker process: the suite's workers run tests side by side.
    cli = ROOT / ".cache" / "suite-order" / str(os.getpid()) / "pulumi"
    cli.parent.mkdir(parents=True, exist_ok=True)
    cli.write_text("#!/bin/sh\necho v3.0.0-stand-in\n")
    cli.chmod(0o755)
    yield cli
    shutil.rmtree(cli.parent)


@pytest.mark.parametrize("marked", [False, True])
def test_running_the_cli_needs_the_mark(
    pytester: pytest.Pytester, real_looking_cli: Path, marked: bool
) -> None:
    cli = real_looking_cli
    mark = "@pytest.mark.pulumi_cli" if marked else ""
    result = suite(
        pytester,
        {
            "test_cli": (
                f"import subprocess\nimport pytest\n{mark}\n"
                f"def test_runs_the_cli():\n"
                f"    subprocess.run([{str(cli)!r}, 'version'], check=True)\n"
            )
        },
    )
    if marked:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*ran the pulumi CLI without @pytest.mark.pulumi_cli*"])


def test_a_stand_in_cli_in_a_temporary_directory_needs_no_mark(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    cli = tmp_path / "bin" / "pulumi"
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\necho v3.0.0-fake\n")
    cli.chmod(0o755)
    test = f"import subprocess\ndef test_fake():\n    subprocess.run([{str(cli)!r}], check=True)\n"
    suite(pytester, {"test_fake": test}).assert_outcomes(passed=1)


def distributed(pytester: pytest.Pytester, files: dict[str, str], workers: int) -> pytest.RunResult:
    """FILES as a suite of their own, run by pytest-xdist's workers as scripts/test runs it."""
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makeini(
        "[pytest]\nmarkers =\n    pulumi_cli: runs the CLI\n    kubernetes: needs the cluster\n"
        "    testbed_alone: has the testbed to itself\n"
    )
    pytester.makepyfile(**files)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(ROOT))
        patch.setenv("HOME", HOME)
        patch.setenv("EGRESS_PROXIES_CLI_GATE", "true")
        patch.setenv("EGRESS_PROXIES_KUBE_GATE", "true")
        # Its locks and timeline of its own, not the running suite's.
        patch.setenv("EGRESS_PROXIES_SUITE_STATE", str(pytester.path / "suite-state"))
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-n", str(workers))


def ran_where(result: pytest.RunResult) -> dict[str, list[str]]:
    """Worker -> the tests it passed, in the order it ran them."""
    workers: dict[str, list[str]] = {}
    for line in result.outlines:
        found = re.match(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+?)(@\S+)?\s*$", line)
        if found:
            workers.setdefault(found[1], []).append(found[2])
    return workers


def test_the_lead_modules_run_before_the_testbeds_first_group(pytester: pytest.Pytester) -> None:
    # One worker takes the work in the queue's order: the lead module (by its
    # name, LEAD_MODULES) before the testbed's group without alone tests.
    bed = "import pytest\n@pytest.fixture\ndef testbed(): pass\n" + "".join(
        f"def test_bed_{i}(testbed): pass\n" for i in range(2)
    )
    unit = "".join(f"def test_unit_{i}(): pass\n" for i in range(2))
    files = {"test_bed": bed, "test_gateway": unit.replace("unit", "lead"), "test_unit": unit}
    result = distributed(pytester, files, 1)
    result.assert_outcomes(passed=6)
    [order] = ran_where(result).values()
    assert [t.split("::")[0] for t in order] == [
        "test_gateway.py",
        "test_gateway.py",
        "test_bed.py",
        "test_bed.py",
        "test_unit.py",
        "test_unit.py",
    ], order


def test_under_workers_the_tests_of_one_machine_wide_thing_share_a_worker_in_order(
    pytester: pytest.Pytester,
) -> None:
    # Each of the testbed's tests takes a while, so a spread over workers would show.
    bed = (
        "import time, pytest\n"
        "@pytest.fixture\n"
        "def testbed(): time.sleep(0.3)\n"
        "@pytest.mark.pulumi_cli\n"
        "def test_bed_cli(testbed): pass\n"
        + "".join(f"def test_bed_{i}(testbed): pass\n" for i in range(5))
    )
    kube = (
        "import pytest\n"
        "pytestmark = [pytest.mark.pulumi_cli, pytest.mark.kubernetes]\n"
        + "".join(f"def test_pods_{i}(): pass\n" for i in range(3))
    )
    unit = "".join(f"def test_unit_{i}(): pass\n" for i in range(12))
    # Modules with more tests than the groups: scope scheduling by size would
    # start them before the groups.
    others = {f"test_more_{m}": unit.replace("unit", f"more{m}") for m in range(3)}
    files = {"test_bed": bed, "test_kube": kube, "test_unit": unit, **others}
    result = distributed(pytester, files, 3)
    result.assert_outcomes(passed=57)
    where = ran_where(result)
    holding = {
        prefix: {gw for gw, tests in where.items() if any(prefix in t for t in tests)}
        for prefix in ("test_bed.py", "test_kube.py")
    }
    assert all(len(workers) == 1 for workers in holding.values()), where
    [bed_worker] = holding["test_bed.py"]
    [kube_worker] = holding["test_kube.py"]
    assert where[bed_worker][0].startswith("test_bed.py"), where  # the groups first
    # Each worker's end, for rebalancing, from the run's own timeline.
    result.stdout.fnmatch_lines(["workers' last test ended at: gw0 * min (* in tests), gw1 *"])
    timeline = (pytester.path / "suite-state" / "timeline.tsv").read_text().splitlines()
    assert len(timeline) == 1 + 57 and timeline[0] == "worker\tstart\tend\ttest"
    assert where[kube_worker][0].startswith("test_kube.py"), where
    in_bed = [t for t in where[bed_worker] if t.startswith("test_bed.py")]
    assert in_bed[-1] == "test_bed.py::test_bed_cli", in_bed  # the CLI's test last
    assert len(in_bed) == 6
    # A module without a group stays together too, in its order (its tests
    # share module fixtures, and some build on the one before).
    [unit_tests] = [
        [t for t in tests if t.startswith("test_unit.py")]
        for tests in where.values()
        if any(t.startswith("test_unit.py") for t in tests)
    ]
    assert unit_tests == [f"test_unit.py::test_unit_{i}" for i in range(12)]


def test_a_program_a_worker_ran_unregistered_fails_the_whole_run(
    pytester: pytest.Pytester,
) -> None:
    test = (
        "import subprocess\n"
        "def test_runs_it():\n"
        "    try:\n"
        "        subprocess.run(['no-such-program-in-any-list'])\n"
        "    except FileNotFoundError:\n"
        "        pass\n"
        "def test_other(): pass\n"
    )
    result = distributed(pytester, {"test_runs": test}, 2)
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*does not register*", "*no-such-program-in-any-list*"])


def test_a_test_marked_testbed_alone_has_the_testbed_to_itself(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The testbed's two workers (its own tests, the guest-booting modules)
    share it, except while a `testbed_alone` test runs: no other test on the
    testbed starts or ends meanwhile. Only the order of events is asserted."""
    log = tmp_path / "events"
    common = (
        "import fcntl, time, pytest\n"
        "@pytest.fixture\n"
        "def testbed(): pass\n"
        "def note(what):\n"
        f"    with open({str(log)!r}, 'a') as out:\n"
        "        fcntl.flock(out, fcntl.LOCK_EX)\n"
        "        out.write(what + '\\n')\n"
    )
    alone = common + (
        "@pytest.mark.testbed_alone\n"
        "def test_alone(testbed):\n"
        "    note('alone-start'); time.sleep(1.0); note('alone-end')\n"
        "def test_after(testbed): note('after')\n"
    )
    guests = common + "".join(
        f"def test_guest_{i}(testbed):\n    note('guest-{i}-start'); time.sleep(0.3); "
        f"note('guest-{i}-end')\n"
        for i in range(6)
    )
    result = distributed(pytester, {"test_bed": alone, "test_stock_image": guests}, 2)
    result.assert_outcomes(passed=8)
    where = ran_where(result)
    assert len(where) == 2, where  # the two groups did run side by side
    events = log.read_text().split()
    start, end = events.index("alone-start"), events.index("alone-end")
    assert end == start + 1, events
    assert all(
        events.index(f"guest-{i}-end") == events.index(f"guest-{i}-start") + 1
        or events.index(f"guest-{i}-start") > end
        or events.index(f"guest-{i}-end") < start
        for i in range(6)
    ), events
