"""The suite's ports (tests/support/ports.py): above the kernel's ephemeral
range, a slice per worker, never the same one twice in turn, never one
something listens on."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from tests.support.ports import _Ports, _slice, bindable, free_port

EPHEMERAL_LAST = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1])


def test_ports_are_above_the_ephemeral_range_and_never_handed_twice() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert min(ports) > EPHEMERAL_LAST


def test_workers_have_slices_of_their_own_above_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        slices.append(_slice())
    assert slices[0].start == EPHEMERAL_LAST + 1
    for before, after in itertools.pairwise(slices):
        assert before.stop <= after.start  # no port in two slices
    assert slices[-1].stop <= 65536


def test_a_port_in_use_is_passed_over_and_the_turn_goes_round() -> None:
    """Another worker's servers hold ports of their own slice only, but this
    one's test must not depend on them: which ports are held is given."""
    held = {61001, 61003}
    ports = _Ports(range(61000, 61004), free=lambda port: port not in held)
    assert [ports.take() for _ in range(3)] == [61000, 61002, 61000]
    held.update({61000, 61002})
    with pytest.raises(RuntimeError, match="no free port left"):
        ports.take()


def test_a_port_something_listens_on_or_holds_is_not_bindable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert not bindable(port)
    with socket.socket() as held:  # bound, never listening: still held
        held.bind(("127.0.0.1", 0))
        assert not bindable(held.getsockname()[1])
