"""What a SeedIso keeps in the state: its documents once, packed into one
input; the outputs keep one digest of them, all that diff needs, and what
delete and read need. The earlier forms are still compared and read:
release c9adc8f's (documents unpacked in the inputs and again in the
outputs), which read writes in the new form, and commit fa889d8's (a digest
per document in the outputs) (docs/kvm-provider.md, "State per proxy")."""

from __future__ import annotations

from typing import Any

import pytest

from providers.kvm.seeddocs import (
    DIGEST,
    DIGESTS,
    DOCUMENTS,
    PACKED,
    digest_text,
    pack,
    packed,
    unpacked,
)
from providers.kvm.seediso import SeedIsoProvider
from tests.support.seeds import SEED, seed_props
from tests.support.testdriver import TestHost

USER_DATA = "#cloud-config\npassword: hunter2-never-stored-twice\n"


def unpacked_inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    """The inputs as the earlier release sent them: each document a key."""
    return seed_props(host, USER_DATA, **changes)


def packed_inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    """The inputs as SeedIso sends them: the documents packed into one."""
    return packed(unpacked_inputs(host, **changes))


def earlier_outputs(outs: dict[str, Any], host: TestHost) -> dict[str, Any]:
    """OUTS as release c9adc8f kept them: its inputs repeated, no digest."""
    return {k: v for k, v in outs.items() if k != DIGEST} | unpacked_inputs(host)


def digest_per_document_outputs(outs: dict[str, Any], host: TestHost) -> dict[str, Any]:
    """OUTS as commit fa889d8 kept them: a digest of each document."""
    documents = {k: v for k, v in unpacked_inputs(host).items() if k in DOCUMENTS and v}
    digests = {k: digest_text(v) for k, v in documents.items()}
    return {k: v for k, v in outs.items() if k != DIGEST} | {DIGESTS: digests}


def test_the_outputs_hold_no_document_and_one_digest(test_host: TestHost) -> None:
    props = packed_inputs(test_host)
    given = {k: v for k, v in unpacked_inputs(test_host).items() if v is not None}
    assert unpacked(props) == given
    outs = dict(SeedIsoProvider().create(props).outs or {})
    assert not {*DOCUMENTS, PACKED} & set(outs), outs
    assert not [v for v in outs.values() if isinstance(v, str) and "hunter2" in v]
    assert set(outs) == {"host", "name", "path", "size", "sha256", DIGEST}
    assert isinstance(outs[DIGEST], str) and len(outs[DIGEST]) == 32
    # The same ISO as from the documents unpacked: nothing in the guest changes.
    test_host.contents.clear()
    again = dict(SeedIsoProvider().create(unpacked_inputs(test_host)).outs or {})
    assert again == outs


def test_diff_against_the_digest_names_the_packed_input(test_host: TestHost) -> None:
    provider = SeedIsoProvider()
    props = packed_inputs(test_host)
    outs = dict(provider.create(props).outs or {})
    assert provider.diff(SEED, outs, props).changes is False
    changes = (
        {"userData": "#cloud-config\n{}\n"},
        {"vendorData": None},
        {"networkConfig": "version: 2\n"},
    )
    for change in changes:
        diff = provider.diff(SEED, outs, packed_inputs(test_host, **change))
        assert (diff.changes, diff.replaces) == (True, []), change  # rewritten in place
    # An empty optional document is none, as before.
    empty = packed_inputs(test_host, networkConfig="")
    assert provider.diff(SEED, outs, empty).changes is False
    moved = provider.diff(SEED, outs, props | {"name": "other-seed.iso"})
    assert moved.replaces == ["name"]


def test_outputs_of_the_earlier_release_are_compared_and_read_into_a_digest(
    test_host: TestHost,
) -> None:
    provider = SeedIsoProvider()
    props = packed_inputs(test_host)
    outs = dict(provider.create(props).outs or {})
    earlier = earlier_outputs(outs, test_host)
    assert provider.diff(SEED, earlier, props).changes is False
    changed = provider.diff(SEED, earlier, packed_inputs(test_host, userData="#cloud-config\n"))
    assert (changed.changes, changed.replaces) == (True, [])  # rewritten in place
    # Unpacked inputs against unpacked outputs: the earlier release's diff.
    unchanged = provider.diff(SEED, earlier, unpacked_inputs(test_host))
    assert unchanged.changes is False
    read = dict(provider.read(SEED, earlier).outs or {})
    assert read == outs  # the documents dropped, their digest the create's
    assert provider.diff(SEED, read, props).changes is False
    provider.delete(SEED, earlier)
    assert test_host.volumes() == set()


def test_outputs_with_a_digest_per_document_are_compared_and_kept_by_read(
    test_host: TestHost,
) -> None:
    provider = SeedIsoProvider()
    props = packed_inputs(test_host)
    outs = digest_per_document_outputs(dict(provider.create(props).outs or {}), test_host)
    assert provider.diff(SEED, outs, props).changes is False
    for change in ({"userData": "#cloud-config\n{}\n"}, {"networkConfig": "version: 2\n"}):
        diff = provider.diff(SEED, outs, packed_inputs(test_host, **change))
        assert (diff.changes, diff.replaces) == (True, []), change  # rewritten in place
    assert dict(provider.read(SEED, outs).outs or {}) == outs  # no documents to digest anew


@pytest.mark.parametrize("value", ["not base64!", pack({"userData": "x"})[:-4], 7])
def test_a_packed_input_that_is_not_one_fails_check_naming_it(
    test_host: TestHost, value: object
) -> None:
    failures = SeedIsoProvider().check({}, packed_inputs(test_host) | {PACKED: value}).failures
    assert [(f.property, f.reason) for f in failures] == [
        (PACKED, "input 'documents' is not packed documents (base64 of zlib of JSON)")
    ]
