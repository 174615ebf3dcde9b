"""Which tests run where and when, when the suite runs in several worker
processes (pytest-xdist, as scripts/test runs it: `-n N`).

Tests that share one machine-wide thing run one after another in one worker,
in a group named for it: those on the libvirt testbed (they boot TCG guests,
and some kill the testbed's sshd or libvirtd: three groups, the second and
third for the longest modules, sharing the testbed but for `testbed_alone`
tests), those on
the Kubernetes cluster (one of them takes the cluster down and up), and those
that build the client's wheel once. Every other module may run in any worker
(its tests together, in order), beside them: the CPU-bound tests fill the core
a booting guest leaves idle. The groups start first, the longest first.

Within a group, and among the modules, the order is the one a serial run
has: the tests of the real Pulumi CLI after the others, and those on the
cluster last, so that on a new machine everything else runs while the
background builds finish.

The groups travel from the workers, which know each test's fixtures, to the
controller, which only sees node ids, through one JSON file per run; a
scheduler of our own reads it. (pytest-xdist's `loadgroup` renames node ids
through an attribute pytest 9.2 no longer reads, so it groups nothing.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.support.kube import KUBE_MARK
from tests.support.shared_use import LOCKS, locked

CLI_MARK = "pulumi_cli"
ALONE_MARK = "testbed_alone"
GROUPS_KEY = "egress_proxies_groups"
# Each test's worker, start and end (seconds since the epoch), per run.
TIMELINE = LOCKS / "timeline.tsv"

# The testbed's tests in three workers of about equal length (measured in
# .cache/suite/timeline.tsv; a worker's testbed tests are mostly waits on
# guests, so three share the two cores with the rest): these modules in the
# second and the third, all the others in the first. The second and the third
# hold every module with a `testbed_alone` test (each group runs those first),
# so that they wait only for the other workers' tests of the moment, not for a
# guest; a module-scoped libvirt connection must survive another worker's
# alone test restarting libvirtd (test_cli_fleet.py's `Fleet.conn`).
TESTBED_MODULES: dict[str, frozenset[str]] = {
    "testbed-2": frozenset(
        {
            "test_stock_image.py",  # whole Debian guests under TCG, minutes each
            "test_end_to_end.py",
            "test_cli_faults.py",
            "test_testbed.py",
            "test_hosts_check.py",
        }
    ),
    "testbed-3": frozenset({"test_cli_interrupted.py", "test_cli_fleet.py"}),
}

# Group name -> the fixtures that put a test in it (first match wins).
GROUPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("testbed", frozenset({"testbed"})),
    ("client-wheel", frozenset({"client_dist", "client_venv"})),
)


def group_of(item: pytest.Item) -> str | None:
    """The worker group ITEM must run in, or None when any worker will do."""
    if item.get_closest_marker(KUBE_MARK) is not None:
        return "kube"  # the cluster's tests, and the mixed stack's testbed use with them
    names = set(getattr(item, "fixturenames", ()))
    for group, fixtures in GROUPS:
        if names & fixtures:
            if group == "testbed":
                for name, modules in TESTBED_MODULES.items():
                    if item.path.name in modules:
                        return name
            return group
    return None


@contextlib.contextmanager
def testbed_turn(item: pytest.Item) -> Iterator[None]:
    """Around a test on the testbed (its setup, call and teardown): a shared
    turn, or the testbed to itself for a test marked `testbed_alone` (it
    kills the testbed's daemons, changes /dev/kvm, or compares everything on
    the host before and after). Other tests need none."""
    if "testbed" not in getattr(item, "fixturenames", ()):
        yield
        return
    LOCKS.mkdir(parents=True, exist_ok=True)
    turns, queue = LOCKS / "testbed.turns", LOCKS / "testbed.queue"
    if item.get_closest_marker(ALONE_MARK) is not None:
        # Queued first: flock grants shared locks while others hold theirs, so
        # a worker whose tests follow one another on the testbed would never
        # leave the exclusive lock a gap (measured: 10 minutes of waiting).
        with locked(queue, fcntl.LOCK_EX), locked(turns, fcntl.LOCK_EX):
            yield
        return
    with locked(queue, fcntl.LOCK_EX):
        pass  # behind a test waiting to be alone, not before it
    with locked(turns, fcntl.LOCK_SH):
        yield


def order_key(item: pytest.Item) -> tuple[bool, bool, bool]:
    """The CLI's tests after the others, the cluster's last; of each kind,
    the tests that need the testbed alone first (one wait for the testbed,
    at the start, while the other worker runs short tests)."""
    return (
        item.get_closest_marker(CLI_MARK) is not None,
        item.get_closest_marker(KUBE_MARK) is not None,
        item.get_closest_marker(ALONE_MARK) is None,
    )


# Under workers, the groups first, the longest first: each starts on a worker
# of its own at once, and the modules fill the workers around them. The
# testbed's first group, which holds no `testbed_alone` test, starts after
# LEAD_MODULES: at the start the other two groups' alone tests hold the
# testbed for minutes, and a worker waiting for its turn computes nothing
# (measured: 22-44 % of the two cores idle in the suite's minutes 1 to 5,
# December 6 2026; that worker waited 140 s). These CPU-bound modules of the
# service fill that time instead.
LEAD = "lead"
LEAD_MODULES = frozenset(
    {
        "test_discovery_pipelining.py",
        "test_gateway.py",
        "test_discovery_names.py",
    }
)
GROUP_RANK = {"testbed-2": 0, "testbed-3": 1, "kube": 2, LEAD: 3, "testbed": 4, "client-wheel": 5}


def plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sorts ITEMS (stable); in a worker, puts the groups first and writes
    each grouped test's group where the controller's scheduler reads it."""
    where = getattr(config, "workerinput", {}).get(GROUPS_KEY)
    if where is None:
        items.sort(key=order_key)
        return
    group = {item.nodeid: group_of(item) for item in items}

    def rank(item: pytest.Item) -> int:
        name = group[item.nodeid] or (LEAD if item.path.name in LEAD_MODULES else "")
        return GROUP_RANK.get(name, 99)

    items.sort(key=lambda item: (rank(item), order_key(item)))
    groups = {nodeid: name for nodeid, name in group.items() if name is not None}
    # Every worker collects the same tests: each writes the same map, whole.
    fd, temporary = tempfile.mkstemp(dir=Path(where).parent)
    with os.fdopen(fd, "w") as out:
        json.dump(groups, out)
    os.replace(temporary, where)


class GroupScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with a test's scope its group, if it
    has one, else its module."""

    def __init__(self, config: pytest.Config, log: Any = None, *, groups: Path) -> None:
        super().__init__(config, log)
        # Work in the order the workers sorted it (GROUP_RANK), not by size.
        config.option.loadscopereorder = False
        self._groups_file = groups
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # first asked once every worker has collected
            self._groups = json.loads(self._groups_file.read_text())
        group = self._groups.get(nodeid)
        # A module's tests stay together otherwise: they share module
        # fixtures (made once), and some build on the one before.
        return f"group:{group}" if group is not None else nodeid.split("::", 1)[0]


class Distribution:
    """The controller's side: a file for the run's groups, handed to each
    worker, and the scheduler that reads it."""

    def __init__(self) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="suite-groups-")
        self.groups = Path(self._directory.name) / "groups.json"
        TIMELINE.parent.mkdir(parents=True, exist_ok=True)
        TIMELINE.write_text("worker\tstart\tend\ttest\n")
        self.started = time.time()

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """When each worker ran its last test, and how busy it was: what to
        rebalance when the suite grows (the whole timeline: TIMELINE)."""
        ended: dict[str, float] = {}
        busy: dict[str, float] = {}
        for line in TIMELINE.read_text().splitlines()[1:]:
            worker, start, end, _ = line.split("\t", 3)
            ended[worker] = max(ended.get(worker, 0.0), float(end) - self.started)
            busy[worker] = busy.get(worker, 0.0) + float(end) - float(start)
        if ended:
            parts = [
                f"{w} {ended[w] / 60:.1f} min ({busy[w] / 60:.1f} in tests)" for w in sorted(ended)
            ]
            terminalreporter.write_line("workers' last test ended at: " + ", ".join(parts))

    @pytest.hookimpl
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[GROUPS_KEY] = str(self.groups)

    @pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> GroupScheduling:
        return GroupScheduling(config, log, groups=self.groups)

    @pytest.hookimpl
    def pytest_unconfigure(self) -> None:
        self._directory.cleanup()


@contextlib.contextmanager
def timed(item: pytest.Item) -> Iterator[None]:
    """In a worker, appends ITEM's start and end to the run's TIMELINE."""
    worker = getattr(item.config, "workerinput", {}).get("workerid")
    started = time.time()
    try:
        yield
    finally:
        if worker is not None:
            with TIMELINE.open("a") as out:
                fcntl.flock(out, fcntl.LOCK_EX)
                out.write(f"{worker}\t{started:.3f}\t{time.time():.3f}\t{item.nodeid}\n")


def distribute(config: pytest.Config) -> None:
    """Installs the groups' scheduler in a controller of a `-n N` run."""
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
        config.pluginmanager.register(Distribution(), "egress-proxies-suite-order")


__all__ = [
    "CLI_MARK",
    "KUBE_MARK",
    "GroupScheduling",
    "distribute",
    "group_of",
    "order_key",
    "plan",
]
