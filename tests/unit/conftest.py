"""Fixtures of the fast tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.testdriver import TestHost


@pytest.fixture
def test_host(tmp_path: Path) -> Iterator[TestHost]:
    """An in-memory libvirt host that every kvm resource in the test reaches."""
    host = TestHost(tmp_path)
    with host.serving():
        yield host
    host.close()
