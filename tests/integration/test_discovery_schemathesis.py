"""Property-based run over the published OpenAPI document (schemathesis): the
real app on a loopback socket, every operation with generated (valid and
invalid) input; no answer may be a 5xx, and every answer must match the
document. Examples per operation are bounded so the run stays short."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.core.result import Err

from tests.support.discovery import ServerThread, proxy_entry, settings_for, write_fleet

pytestmark = pytest.mark.integration
# An operation as schemathesis' get_all_operations yields it: the four type
# parameters (its internal parameter, response and schema classes) left open,
# as schemathesis itself leaves them.
Operation: TypeAlias = schemathesis.APIOperation[Any, Any, Any, Any]

TOKEN = "schemathesis-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp: Path = tmp_path_factory.mktemp("schemathesis")
    config = settings_for(tmp, token=TOKEN, max_lease_ttl=30)
    assert config.fleet_file is not None
    # More proxies than examples: grants keep finding something to lease.
    write_fleet(
        config.fleet_file,
        [
            proxy_entry(f"p{i}", port=5000 + i, zone=f"z{i % 3}", labels={"n": str(i % 2)})
            for i in range(300)
        ],
    )
    with ServerThread(config) as running:
        yield running


# schemathesis' own pytest plugin (`@schema.parametrize()`) does not work with
# this pytest; hypothesis drives each operation's strategy directly instead.
# (method, path, has inputs that can be wrong)
OPERATIONS = [
    ("POST", "/v1/leases", True),
    ("POST", "/v1/leases/{lease_id}/renew", True),
    ("POST", "/v1/leases/{lease_id}/report", True),
    ("DELETE", "/v1/leases/{lease_id}", True),
    ("POST", "/v1/gateway/report", True),
    ("GET", "/v1/proxies", False),
    ("GET", "/v1/signals", True),
    ("GET", "/ui/api/status", True),
    ("GET", "/healthz", False),
    ("GET", "/readyz", False),
    ("GET", "/metrics", False),
]
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path, inputs in OPERATIONS
    for mode in schemathesis.GenerationMode
    if inputs or mode is schemathesis.GenerationMode.POSITIVE
]


@pytest.fixture(scope="module")
def operations(server: ServerThread) -> dict[tuple[str, str], Operation]:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    found = {}
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # an operation of the document schemathesis cannot read
        operation = result.ok()
        found[(operation.method.upper(), operation.path)] = operation
    assert set(found) == {(method, path) for method, path, _ in OPERATIONS}
    return found


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_server_errors_and_answers_match_the_document(
    operations: dict[tuple[str, str], Operation],
    server: ServerThread,
    method: str,
    path: str,
    mode: schemathesis.GenerationMode,
) -> None:
    operation = operations[(method, path)]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case[Operation]) -> None:
        # The right token, unless the case is about a header made invalid (the
        # token left out): adding it would make the case valid and its 200 a
        # "schema-violating request accepted".
        headers = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
        negative = headers is not None and headers.mode is schemathesis.GenerationMode.NEGATIVE
        case.call_and_validate(base_url=server.url, headers=None if negative else AUTH)

    check()
