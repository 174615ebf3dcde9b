"""The fleet manifest, version 1: the stack output ``fleet`` that the
discovery service reads. Its JSON Schema is schemas/fleet-manifest.v1.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "fleet-manifest.v1.json"

ProxyType = Literal["kvm", "gcp", "kubernetes", "external"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManifestAuth(_Strict):
    username: str
    password: str


class ManifestProxy(_Strict):
    name: str
    id: Annotated[str, Field(pattern=r"^proxy-[0-9a-f]{10}$")]
    provider: str
    type: ProxyType
    zone: str | None
    host: str
    port: Annotated[int, Field(ge=1, le=65535)]
    labels: dict[str, str]
    auth: ManifestAuth | None = None


class Manifest(_Strict):
    version: Literal[1]
    project: str
    stack: str
    proxies: list[ManifestProxy]


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema
