"""The suite's ports (tests/support/ports.py): above the kernel's ephemeral
range, a slice per worker, never the same one twice in turn, never one
something listens on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.ports import _Ports, free_port

EPHEMERAL_LAST = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1])


def test_ports_are_above_the_ephemeral_range_and_never_handed_twice() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert min(ports) > EPHEMERAL_LAST


def test_workers_have_slices_of_their_own_and_a_port_in_use_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = _Ports()
    port = first.take()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = _Ports()
    taken = second.take()
    assert taken - port >= (65536 - EPHEMERAL_LAST - 1) // 4 - 1  # gw1's slice starts past gw0's
    with socket.create_server(("127.0.0.1", taken + 1)):
        assert second.take() == taken + 2  # the listened-on one passed over
