"""The fleet manifest, version 1: the stack output ``fleet`` that the
discovery service reads. The program builds it with these models, and its
JSON Schema (schemas/fleet-manifest.v1.json) is generated from them:
``python -m proxyinfra.manifest > schemas/fleet-manifest.v1.json``
(tests/unit/test_manifest_schema.py checks the file matches)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from proxyinfra.printable import KEYS, Key, Name, Value, check_printable, text_field

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "fleet-manifest.v1.json"
SCHEMA_ID = "https://egress-proxies.invalid/schemas/fleet-manifest.v1.json"

Text = Annotated[str, Field(min_length=1)]

PULUMI_NAME = r"^[A-Za-z0-9_.-]{1,100}$"
_PULUMI_NAME = re.compile(PULUMI_NAME)


def _pulumi_name(value: str) -> str:
    # Pulumi's own rule for project and stack names: no `/`, so that a
    # proxy's name qualified by its stack (`STACK/NAME`, when several stacks
    # are served as one) is never another stack's.
    if not _PULUMI_NAME.fullmatch(value):
        shown = repr(value if len(value) <= 40 else value[:32] + "...")
        raise PydanticCustomError(
            "pulumi_name",
            "{shown} is no Pulumi name: 1 to 100 letters, digits, _, . and -",
            {"shown": shown},
        )
    return value


PulumiName = Annotated[
    str,
    Field(
        json_schema_extra={"pattern": PULUMI_NAME},
        description="as Pulumi allows: 1 to 100 letters, digits, _, . and -",
    ),
    AfterValidator(_pulumi_name),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManifestAuth(_Strict):
    username: Text
    password: Text


class ManifestProxy(_Strict):
    name: Annotated[
        str,
        text_field(description="logical replica name, e.g. home-0"),
        AfterValidator(check_printable),
    ]
    id: Annotated[str, Field(pattern=r"^proxy-[0-9a-f]{10}$")]
    provider: Name
    type: Annotated[
        str,
        Field(
            pattern=r"^[a-z][a-z0-9-]*$",
            description="the backend's type: kvm, gcp, kubernetes, external (or another registered one)",
        ),
    ]
    zone: Annotated[
        Value | None, Field(description="kvm host name, GCP zone; null where it has none")
    ]
    host: Annotated[str, Field(min_length=1, description="address crawlers connect to")]
    port: Annotated[int, Field(ge=1, le=65535)]
    labels: Annotated[dict[Key, Value], Field(json_schema_extra=KEYS)]
    auth: ManifestAuth | None = None


class Manifest(_Strict):
    version: Literal[1]
    project: PulumiName
    stack: PulumiName
    proxies: list[ManifestProxy]

    def document(self) -> dict[str, Any]:
        """As the stack exports it: ``auth`` only where there are credentials."""
        return self.model_dump(exclude_defaults=True)


def json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "egress-proxies fleet manifest, version 1 (stack output `fleet`)",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


if __name__ == "__main__":
    sys.stdout.write(schema_text())
