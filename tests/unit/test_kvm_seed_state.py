"""What a SeedIso keeps in the state: its documents once, in the inputs; the
outputs keep a digest of each, all that diff needs, and what delete and read
need. Outputs of an earlier release (documents in them) are still compared
and read, and read writes them in the new form (docs/kvm-provider.md,
"State per proxy")."""

from __future__ import annotations

from typing import Any

from providers.kvm.seediso import DIGESTS, DOCUMENTS, SeedArgs, SeedIsoProvider
from tests.support.testdriver import TestHost

SEED = "proxy-0123456789-seed.iso"
USER_DATA = "#cloud-config\npassword: hunter2-never-stored-twice\n"


def seed_inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    args: SeedArgs[str] = SeedArgs(
        host=host.access(),
        name=SEED,
        user_data=USER_DATA,
        meta_data="instance-id: proxy-0123456789-00000000\n",
        vendor_data="#!/bin/sh\ntrue\n",
    )
    return args.to_props() | changes


def earlier_outputs(outs: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """OUTS as the release before kept them: the inputs repeated, no digests."""
    return {k: v for k, v in outs.items() if k != DIGESTS} | inputs


def test_the_outputs_hold_no_document_and_a_digest_of_each(test_host: TestHost) -> None:
    props = seed_inputs(test_host)
    outs = dict(SeedIsoProvider().create(props).outs or {})
    assert not set(DOCUMENTS) & set(outs), outs
    assert not [v for v in outs.values() if isinstance(v, str) and "hunter2" in v]
    assert set(outs[DIGESTS]) == {"userData", "metaData", "vendorData"}
    assert {"host", "name", "path", "size", "sha256"} <= set(outs)


def test_diff_against_the_digests_names_the_document_that_changed(test_host: TestHost) -> None:
    provider = SeedIsoProvider()
    props = seed_inputs(test_host)
    outs = dict(provider.create(props).outs or {})
    assert provider.diff(SEED, outs, props).changes is False
    for key, value in (("userData", "#cloud-config\n{}\n"), ("vendorData", None)):
        diff = provider.diff(SEED, outs, props | {key: value})
        assert (diff.changes, diff.replaces) == (True, [key])
    added = provider.diff(SEED, outs, props | {"networkConfig": "version: 2\n"})
    assert added.replaces == ["networkConfig"]
    # An empty optional document is none, as before.
    assert provider.diff(SEED, outs, props | {"networkConfig": ""}).changes is False


def test_outputs_of_the_earlier_release_are_compared_and_read_into_digests(
    test_host: TestHost,
) -> None:
    provider = SeedIsoProvider()
    props = seed_inputs(test_host)
    outs = dict(provider.create(props).outs or {})
    earlier = earlier_outputs(outs, props)
    assert provider.diff(SEED, earlier, props).changes is False
    changed = provider.diff(SEED, earlier, props | {"userData": "#cloud-config\n{}\n"})
    assert changed.replaces == ["userData"]
    read = dict(provider.read(SEED, earlier).outs or {})
    assert read == outs  # the documents dropped, their digests the create's
    assert provider.diff(SEED, read, props).changes is False
    provider.delete(SEED, earlier)
    assert test_host.volumes() == set()
