"""Issue 42, point 3: the fleet's probing shared between replicas on
PostgreSQL. One replica probed the whole fleet, so one event loop bounded
the fleet (50,000 proxies every 10 s take nearly two cores of it, see
bench/health_probes.py). Now every live replica holds a probing slot and
probes its share: each proxy by exactly one replica, the shares computed
again when a replica comes or goes.

Real replicas (`python -m discovery serve`) on the real PostgreSQL, with a
CONNECT responder per proxy that notes every probe it receives: the counts
are taken at the proxies, whoever sent them."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from discovery.postgres.prober import FLUSH_S
from tests.support.discovery import ServiceProcess, wait_for
from tests.support.postgres import PostgresServer
from tests.support.postgres import postgres as postgres
from tests.support.probe_log import ProbeLog
from tests.support.replicas import INTERVAL, replica, write

pytestmark = pytest.mark.integration

PROXIES = 16  # at most NAMES_LOGGED: a replica's log names its whole share
NAMES = [f"p{i}" for i in range(PROXIES)]
PERIOD = float(INTERVAL)
# docs/discovery.md: a dead replica's proxies are probed again within one
# interval (their last probe) + one round (FLUSH_S, the survivors' read of
# the live slots) + the time to probe them (at once); 2 s for a busy
# machine (the whole suite runs 4 workers on 2 cores).
TAKEOVER_BOUND = PERIOD + FLUSH_S + 2.0


@dataclass
class Sharing:
    url: str
    fleet: Path
    log: ProbeLog
    tmp: Path
    replicas: list[ServiceProcess]

    def add(self) -> ServiceProcess:
        member = replica(self.url, self.fleet, self.tmp / f"r{len(self.replicas)}.log")
        self.replicas.append(member)
        return member.start()

    def port(self, name: str) -> int:
        return self.log.ports[NAMES.index(name)]


@pytest.fixture
def sharing(postgres: PostgresServer, tmp_path: Path) -> Iterator[Sharing]:
    url = postgres.fresh_database(f"sharing_{random.randrange(1 << 30)}")
    log = ProbeLog.start(PROXIES)
    fleet = tmp_path / "fleet.json"
    write(fleet, log.ports, NAMES)
    running = Sharing(url, fleet, log, tmp_path, [])
    try:
        yield running
    finally:
        for member in running.replicas:
            member.stop()
        log.stop()


def share(member: ServiceProcess) -> tuple[list[int], set[str]] | None:
    """(live slots, proxies) of the replica's last share, from its log."""
    said = [e for e in member.events() if e["event"] == "probing a share of the fleet"]
    if not said:
        return None
    last = said[-1]
    assert not last["proxies"].endswith("..."), last  # every name is listed
    names = set(last["proxies"].split(", ")) if last["proxies"] else set()
    assert len(names) == last["count"]
    return [int(s) for s in last["slots"].split(", ")], names


def shares_settled(members: list[ServiceProcess]) -> list[set[str]] | None:
    """Each replica's share once all of them see the same len(members) slots."""
    seen = [share(m) for m in members]
    if any(s is None or len(s[0]) != len(members) for s in seen):
        return None
    return [s[1] for s in seen if s is not None]


def settle(members: list[ServiceProcess]) -> list[set[str]]:
    wait_for(lambda: shares_settled(members) is not None, timeout=20, what="shares settled")
    shares = shares_settled(members)
    assert shares is not None
    return shares


def assert_partition(shares: list[set[str]]) -> None:
    assert all(shares), shares  # every replica probes some
    assert sum(map(len, shares)) == PROXIES  # no proxy in two shares
    assert set().union(*shares) == set(NAMES)  # none in no share


def assert_one_prober_each(sharing: Sharing, window: float = 4.0) -> None:
    """Counted at the proxies over `window`: each probed as one prober does
    (every 0.9-1 x the interval: 8-9 probes in 4 s), not twice as often (two
    probers: 16-18), not never. The bounds leave half and 1.5 x that for a
    busy machine, where a replica's loop may run late."""
    since = time.monotonic()
    time.sleep(window)
    counts = {n: len(sharing.log.between(sharing.port(n), since, since + window)) for n in NAMES}
    low, high = int(window / PERIOD / 2), int(window / (PERIOD * 0.9) * 1.5)
    assert all(low <= c <= high for c in counts.values()), (low, high, counts)


def test_two_replicas_share_the_fleet_each_proxy_probed_by_one(sharing: Sharing) -> None:
    a, b = sharing.add(), sharing.add()
    shares = settle([a, b])
    assert_partition(shares)
    assert_one_prober_each(sharing)
    # Who probes what, seen at the proxies: a frozen, its share goes unprobed
    # (its slot stays: the connection lives) while b's goes on.
    assert a.process is not None
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        time.sleep(PERIOD)  # probes a started before the stop are done
        since = time.monotonic()
        time.sleep(8 * PERIOD)  # b probes each of its share about 8 times
        probed = {n for n in NAMES if sharing.log.between(sharing.port(n), since)}
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    assert probed == shares[1]


def test_a_replica_killed_its_share_is_probed_by_the_other_within_the_bound(
    sharing: Sharing,
) -> None:
    a, b = sharing.add(), sharing.add()
    a_share, _ = settle([a, b])
    time.sleep(2 * PERIOD)  # every proxy probed since the shares settled
    a.kill()
    killed_at = time.monotonic()
    wait_for(
        lambda: (s := share(b)) is not None and s[1] == set(NAMES),
        timeout=10,
        what="b probing the whole fleet",
    )
    time.sleep(TAKEOVER_BOUND)
    for name in a_share:
        before = sharing.log.between(sharing.port(name), 0.0, killed_at)
        after = sharing.log.between(sharing.port(name), killed_at)
        assert before and after, name
        assert after[0] - before[-1] <= TAKEOVER_BOUND, (name, after[0] - before[-1])
    assert_one_prober_each(sharing)


def test_a_replica_added_the_fleet_is_shared_again(sharing: Sharing) -> None:
    a, b = sharing.add(), sharing.add()
    before = settle([a, b])
    c = sharing.add()
    after = settle([a, b, c])
    assert_partition(after)
    # Only proxies the new replica wins moved: a and b kept the rest.
    assert after[0] <= before[0] and after[1] <= before[1]
    assert_one_prober_each(sharing)
