"""Fixtures of several integration modules: an echo server to CONNECT to
through a real squid, and a GCE metadata server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gce_metadata import MetadataServer
from tests.support.squid import EchoServer


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def gce_server() -> Iterator[MetadataServer]:
    md = MetadataServer()
    yield md
    md.close()
