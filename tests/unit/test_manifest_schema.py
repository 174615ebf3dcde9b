"""schemas/fleet-manifest.v1.json is generated from the manifest's models
(`python -m proxyinfra.manifest`), so the file, the program's output and the
discovery service's parser are one contract."""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import ValidationError

from proxyinfra.manifest import SCHEMA_PATH, Manifest, load_schema, schema_text


def test_the_schema_file_is_the_one_the_models_generate() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), (
        "regenerate it: .venv/bin/python -m proxyinfra.manifest > schemas/fleet-manifest.v1.json"
    )


ENTRY = {
    "name": "home-0",
    "id": "proxy-3f2a9c1b7d",
    "provider": "kvm-home",
    "type": "kvm",
    "zone": "nas1",
    "host": "192.168.1.73",
    "port": 3128,
    "labels": {"site": "home"},
}


def manifest(**entry: object) -> dict[str, object]:
    return {"version": 1, "project": "p", "stack": "s", "proxies": [{**ENTRY, **entry}]}


@pytest.mark.parametrize(
    "document",
    [manifest(), manifest(auth={"username": "u", "password": "pw"}), manifest(zone=None)],
)
def test_model_and_schema_accept_the_same_documents(document: dict[str, object]) -> None:
    jsonschema.validate(document, load_schema())
    assert Manifest.model_validate(document).document() == document


@pytest.mark.parametrize(
    "document",
    [
        manifest(port=0),
        manifest(id="home-0"),
        manifest(host=""),
        manifest(type="KVM"),
        manifest(extra=1),
        manifest(auth={"username": "u"}),
        {**manifest(), "version": 2},
        # Names that reach logs and pages (proxyinfra/printable.py), stacks as Pulumi has them.
        manifest(name="home\u0000"),
        manifest(name="home\u202e0"),
        manifest(name="h" * 257),
        manifest(provider="kvm\u2028"),
        manifest(zone="nas\u0085"),
        manifest(labels={"site": "home\u200b"}),
        manifest(labels={"si\u0007te": "home"}),
        {**manifest(), "stack": "a/b"},
        {**manifest(), "project": "p q"},
    ],
)
def test_model_and_schema_refuse_the_same_documents(document: dict[str, object]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, load_schema())
    with pytest.raises(ValidationError):
        Manifest.model_validate(document)
