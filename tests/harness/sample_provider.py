"""A small dynamic resource with observable effects, used to test the harness itself.

A Note is a JSON file `<directory>/<filename>` holding its text and count. Changing
`directory` or `filename` replaces the note; changing `text` or `count` updates it in
place. A non-empty `fail` input makes create fail with exactly that message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    ConfigureRequest,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

REPLACE_KEYS = ("directory", "filename")
UPDATE_KEYS = ("text", "count")
REQUIRED_KEYS = ("directory", "filename", "text")


class NoteError(Exception):
    pass


class NoteProvider(ResourceProvider):
    """Pickled by reference: the provider process must be able to import this module."""

    stamp: str | None = None

    def configure(self, req: ConfigureRequest) -> None:
        # Stack config reaches a dynamic provider only through the engine's Configure call.
        self.stamp = req.config.get("stamp")

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = [CheckFailure(k, f"{k} is required") for k in REQUIRED_KEYS if k not in news]
        return CheckResult(news, failures)

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # An unknown value (pulumi.output.Unknown) never equals the old one: it counts as a change.
        replaces = [k for k in REPLACE_KEYS if olds.get(k) != news.get(k)]
        updates = [k for k in UPDATE_KEYS if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(replaces or updates), replaces=replaces)

    def create(self, props: dict[str, Any]) -> CreateResult:
        if props.get("fail"):
            raise NoteError(props["fail"])
        path = _write(props)
        print(f"note: created {path}", file=sys.stderr)
        return CreateResult(str(path), self._outputs(props, path))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        path = Path(id_)
        if not path.exists():
            return ReadResult("", {})
        stored = json.loads(path.read_text())
        return ReadResult(id_, {**props, "text": stored["text"], "count": stored["count"]})

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        path = _write(news)
        print(f"note: updated {path}", file=sys.stderr)
        return UpdateResult(self._outputs(news, path))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        Path(id_).unlink()
        print(f"note: deleted {id_}", file=sys.stderr)

    def _outputs(self, props: dict[str, Any], path: Path) -> dict[str, Any]:
        count = props.get("count", 0)
        # count_type shows what the provider received: numbers cross gRPC as floats.
        outs = {**props, "path": str(path), "count_type": type(count).__name__}
        return {**outs, "stamp": self.stamp} if self.stamp is not None else outs


def _write(props: dict[str, Any]) -> Path:
    path = Path(props["directory"]) / str(props["filename"])
    count = props.get("count", 0)
    path.write_text(json.dumps({"text": props["text"], "count": count}))
    return path


class Note(pulumi.dynamic.Resource):
    path: pulumi.Output[str]
    text: pulumi.Output[str]
    count: pulumi.Output[float]
    count_type: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        directory: pulumi.Input[str],
        filename: pulumi.Input[str],
        text: pulumi.Input[str],
        count: pulumi.Input[float] = 0,
        fail: str | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props: dict[str, Any] = {
            "directory": directory,
            "filename": filename,
            "text": text,
            "count": count,
            "fail": fail,
            # Outputs must be declared (as None) to become attributes of the resource.
            "path": None,
            "count_type": None,
        }
        super().__init__(NoteProvider(), name, props, opts)
