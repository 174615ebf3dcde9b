"""The rule that splits the fleet's probing between the live replicas on
PostgreSQL (discovery/postgres/sharing.py): one prober per proxy, and a
replica that comes or goes moves only the proxies it wins or held."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from discovery.postgres.sharing import owner, share

NAMES = [f"proxy-{i}" for i in range(10_000)]


@pytest.mark.parametrize("slots", [[0], [0, 1], [0, 1, 2], [3, 7, 8, 40]])
def test_each_proxy_has_exactly_one_prober(slots: list[int]) -> None:
    shares = [share(NAMES, slot, slots) for slot in slots]
    assert sum(map(len, shares)) == len(NAMES)
    assert set().union(*shares) == set(NAMES)
    for slot, mine in zip(slots, shares, strict=True):
        assert all(owner(name, slots) == slot for name in mine)


def test_the_split_is_even() -> None:
    counts = Counter(owner(name, [0, 1, 2]) for name in NAMES)
    assert all(3000 <= n <= 3700 for n in counts.values()), counts


def test_a_replica_added_takes_only_what_it_wins() -> None:
    before = {name: owner(name, [0, 1]) for name in NAMES}
    after = {name: owner(name, [0, 1, 2]) for name in NAMES}
    moved = [name for name in NAMES if before[name] != after[name]]
    assert all(after[name] == 2 for name in moved)
    assert 3000 <= len(moved) <= 3700  # about a third


def test_a_replica_gone_its_proxies_spread_over_the_others() -> None:
    before = {name: owner(name, [0, 1, 2]) for name in NAMES}
    after = {name: owner(name, [0, 2]) for name in NAMES}
    moved = [name for name in NAMES if before[name] != after[name]]
    assert {before[name] for name in moved} == {1}
    assert Counter(after[name] for name in moved).keys() == {0, 2}
    assert len(moved) == sum(1 for slot in before.values() if slot == 1)


def test_the_same_owner_in_every_process() -> None:
    # A digest of the name, not hash(): PYTHONHASHSEED differs between replicas.
    code = (
        "from discovery.postgres.sharing import owner;"
        "print([owner(f'p{i}', [0, 1, 2]) for i in range(64)])"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert seen == {f"{[owner(f'p{i}', [0, 1, 2]) for i in range(64)]}\n"}
    # The order the slots are read in does not matter either.
    assert [owner(f"p{i}", [0, 1]) for i in range(8)] == [owner(f"p{i}", [1, 0]) for i in range(8)]


def test_a_replica_without_a_live_slot_probes_nothing() -> None:
    assert share(NAMES, 5, [0, 1]) == set()
    assert share(NAMES, 0, [0]) == set(NAMES)
