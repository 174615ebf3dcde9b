"""Small Pulumi programs for the run_program tests (each function builds one stack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockCallArgs, MockResourceArgs

from tests.harness.sample_provider import Note


class Notebook(pulumi.ComponentResource):
    """An ordinary component with two notes; the second's text comes from the first's path."""

    def __init__(self, name: str, directory: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("egress:test:Notebook", name, {"directory": directory}, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.first = Note(
            "first", directory=directory, filename="first.txt", text="one", count=1, opts=child
        )
        second_text = self.first.path.apply(lambda path: f"after {Path(path).name}")
        self.second = Note(
            "second", directory=directory, filename="second.txt", text=second_text, opts=child
        )
        self.register_outputs({"first": self.first.path, "second": self.second.path})


def notes() -> dict[str, Any]:
    """Config: dir, secretText, count; optional failText adds a note whose create fails."""
    config = pulumi.Config()
    directory = config.require("dir")
    book = Notebook("book", directory)
    extra = Note(
        "extra",
        directory=directory,
        filename="extra.txt",
        text=config.require_secret("secretText"),
        count=config.require_int("count"),
    )
    fail_text = config.get("failText")
    if fail_text:
        Note(
            "broken",
            directory=directory,
            filename="broken.txt",
            text=book.second.text,
            fail=fail_text,
        )
    names = pulumi.Output.all(book.first.path, book.second.path, extra.path)
    return {
        "firstPath": book.first.path,
        "secondText": book.second.text,
        "countType": book.first.count_type,
        "files": names.apply(lambda paths: [Path(p).name for p in paths]),
        "extraText": extra.text,
    }


def things() -> dict[str, Any]:
    """Ordinary resources under a component, structured config, and one mocked Note."""
    config = pulumi.Config()
    labels = config.require_object("labels")
    group = pulumi.ComponentResource("egress:test:Group", "group")
    child = pulumi.ResourceOptions(parent=group)
    web = pulumi.CustomResource("egress:test:Thing", "web", {"size": 2, "labels": labels}, child)
    db = pulumi.CustomResource(
        "egress:test:Thing", "db", {"size": 5, "peer": web.id, "password": "pw"}, child
    )
    # Not hybrid: the dynamic resource is mocked like any other, its provider never runs.
    Note("note", directory=config.require("dir"), filename="note.txt", text="mocked")
    zone = pulumi.runtime.invoke("egress:test:getZone", {"name": "nas1"}).value
    pulumi.export("exported", "via pulumi.export")
    return {
        "webId": web.id,
        "dbPeer": db.urn.apply(lambda _: "see resources"),
        "labels": labels,
        "token": pulumi.Output.secret("t0ken"),
        "zone": zone,
    }


def add_address(args: MockResourceArgs) -> tuple[str, dict[str, Any]] | None:
    """A new_resource hook: Things get an address output; everything else the default."""
    if args.typ != "egress:test:Thing":
        return None
    address = f"10.0.0.{int(args.inputs['size'])}"  # mocks see numbers as floats too
    return f"{args.name}-custom-id", {**args.inputs, "address": address}


def get_zone(args: MockCallArgs) -> dict[str, Any] | None:
    """A call hook: answers the getZone invoke."""
    return {"zone": args.args["name"].upper()} if args.token == "egress:test:getZone" else None


def fails() -> dict[str, Any]:
    raise pulumi.RunError("fleet config is invalid:\n- proxies[0].provider: unknown 'kvm-x'")
