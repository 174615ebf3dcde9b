"""The request bodies' rules that the OpenAPI document states too: a TTL of
at least one second, on a grant and on a renewal; and how a refusal names
what is wrong without echoing what the client sent."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from discovery.hotpath import describe
from discovery.openapi import openapi_document
from discovery.schemas import MIN_TTL_S, LeaseRequest, RenewRequest


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (LeaseRequest, '{"holder": "c", "ttlSeconds": 1e-9}'),
        (LeaseRequest, '{"holder": "c", "ttlSeconds": 0.999}'),
        (LeaseRequest, '{"holder": "c", "ttlSeconds": 0}'),
        (RenewRequest, '{"ttlSeconds": 1e-300}'),
        (RenewRequest, '{"ttlSeconds": 5e-324}'),
        (RenewRequest, '{"ttlSeconds": -1}'),
    ],
)
def test_a_ttl_under_one_second_is_refused(model: type[BaseModel], body: str) -> None:
    """Such a lease would have ended before its answer arrived."""
    with pytest.raises(ValidationError) as refused:
        model.model_validate_json(body)
    [problem] = refused.value.errors(include_input=False, include_url=False)
    assert problem["loc"] == ("ttlSeconds",)
    assert problem["msg"] == "Input should be greater than or equal to 1"


def test_a_ttl_of_one_second_and_more_is_taken() -> None:
    assert LeaseRequest.model_validate_json('{"holder": "c", "ttlSeconds": 1}').ttl_seconds == 1
    assert RenewRequest.model_validate_json('{"ttlSeconds": 1.5}').ttl_seconds == 1.5
    assert RenewRequest.model_validate_json("{}").ttl_seconds is None


def test_the_openapi_document_states_the_minimum() -> None:
    schemas: dict[str, Any] = openapi_document(bearer=True)["components"]["schemas"]
    for model in ("LeaseRequest", "RenewRequest"):
        ttl = schemas[model]["properties"]["ttlSeconds"]
        [number] = [s for s in ttl["anyOf"] if s.get("type") == "number"]
        assert number["minimum"] == MIN_TTL_S == 1
        assert "at least 1" in ttl["description"]


def test_a_refusal_names_where_but_never_echoes_a_key_the_client_sent() -> None:
    body = '{"holder": "h", "selector": {"labels": {"pw=hunter2\\u0000": "v", "ok": "x\\u0007"}}}'
    try:
        LeaseRequest.model_validate_json(body)
    except ValidationError as exc:
        detail = describe(exc)
    else:
        raise AssertionError("accepted")
    assert "hunter2" not in detail and "\\x00" not in detail and "\\u0000" not in detail
    assert "selector.labels.….[key]: U+0000 (a control character)" in detail
    assert "selector.labels.ok: U+0007 (a control character)" in detail  # a plain key is a location
