"""Fixtures of several integration modules: an echo server to CONNECT to
through a real squid, a GCE metadata server on loopback, and a loopback
address that refuses connections."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.deadsites import refused_port
from tests.support.gce_metadata import MetadataServer
from tests.support.squid import EchoServer


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def refused() -> Iterator[str]:
    """127.0.0.1:PORT where nothing listens for the test's time (held: no
    server the suite starts meanwhile can take it)."""
    with refused_port() as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture
def gce_server() -> Iterator[MetadataServer]:
    md = MetadataServer()
    yield md
    md.close()
