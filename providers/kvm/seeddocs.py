"""A seed's documents in the state: once, packed, in the inputs; one digest
of them in the outputs.

The program sends user-data, meta-data, vendor-data and network-config as
one secret input, ``documents``: the JSON of those given, zlib-compressed,
base64. They are secrets, so a diff never showed them; packed they are one
secret of 2.5 KiB in the state instead of three of 4.5 KiB (a proxy's
squid.conf and vendor-data compress well). The outputs keep one digest of
them all (``digest``, secret too: a plain digest of mostly known documents
lets a state reader test guesses of a secret in them), all that diff needs:
any change of a document replaces the seed, and diff names ``documents``.

Earlier forms are still read. Release c9adc8f sent the documents unpacked and
kept them in the outputs again: such outputs (and unpacked inputs) read the
same through :func:`unpacked`, so diff compares them and read rewrites them
as the digest. Commit fa889d8 kept a digest of each document (``digests``):
diff compares those, and read keeps them (it has no documents to digest).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from collections.abc import Mapping
from typing import Any

from providers.kvm.args import is_unknown

REQUIRED_DOCUMENTS = ("userData", "metaData")
OPTIONAL_DOCUMENTS = ("vendorData", "networkConfig")
DOCUMENTS = REQUIRED_DOCUMENTS + OPTIONAL_DOCUMENTS
PACKED = "documents"
DIGEST = "digest"
DIGESTS = "digests"  # fa889d8's form: a digest per document
# The documents' digest in the outputs: for change detection only, so 128 bits.
DIGEST_CHARS = 32
# In diff's view of the state, a document whose digest no new one matches.
_CHANGED = object()


def pack(documents: Mapping[str, Any]) -> str:
    """The documents given (None: not given) as the one input."""
    given = {k: v for k, v in documents.items() if v is not None}
    text = json.dumps(given, sort_keys=True, separators=(",", ":"))
    return base64.b64encode(zlib.compress(text.encode(), 9)).decode()


def packed(props: dict[str, Any]) -> dict[str, Any]:
    """PROPS (known values) with their documents packed, as SeedIso sends them."""
    rest = {k: v for k, v in props.items() if k not in DOCUMENTS}
    return rest | {PACKED: pack({k: props.get(k) for k in DOCUMENTS})}


def unpack(packed: Any) -> dict[str, Any]:
    """The documents of a packed input; a ValueError naming the input (never
    its content) when it is not one."""
    try:
        documents = json.loads(zlib.decompress(base64.b64decode(packed, validate=True)))
    except (TypeError, ValueError, binascii.Error, zlib.error):
        raise ValueError(
            f"input {PACKED!r} is not packed documents (base64 of zlib of JSON)"
        ) from None
    if not isinstance(documents, dict) or not set(documents) <= set(DOCUMENTS):
        raise ValueError(f"input {PACKED!r} holds other keys than {', '.join(DOCUMENTS)}")
    return documents


def unpacked(props: dict[str, Any]) -> dict[str, Any]:
    """PROPS with the documents as keys of their own: unpacked from
    ``documents`` when there is one (each not known yet when it is not),
    else as they are (an earlier release's inputs and outputs)."""
    if PACKED not in props:
        return props
    rest = {k: v for k, v in props.items() if k != PACKED and k not in DOCUMENTS}
    value = props[PACKED]
    if is_unknown(value):
        return rest | dict.fromkeys(DOCUMENTS, value)
    return rest | unpack(value)


def digest_text(text: str) -> str:
    """The digest of one document (commit fa889d8 kept one per document)."""
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def digest_of(documents: Mapping[str, Any]) -> str:
    """One digest of the DOCUMENTS (unpacked) given: an empty optional one is
    none, and the packing's own bytes (compression) count for nothing."""
    given = {
        k: documents[k] for k in DOCUMENTS if isinstance(documents.get(k), str) and documents[k]
    }
    return digest_text(json.dumps(given, sort_keys=True, separators=(",", ":")))


def kept_digests(props: dict[str, Any]) -> dict[str, Any]:
    """What the outputs keep of the documents PROPS hold (inputs, or outputs
    of any form): the digest kept already (fa889d8's per document included),
    else the digest of the documents."""
    for key in (DIGEST, DIGESTS):
        if isinstance(props.get(key), str | dict):
            return {key: props[key]}
    return {DIGEST: digest_of(unpacked(props))}


def state_view(olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """The state as diff compares it with NEWS (unpacked): outputs of release
    c9adc8f hold the documents themselves; later ones a digest, and where the
    new documents have the digest kept, the state holds those documents."""
    digest, digests = olds.get(DIGEST), olds.get(DIGESTS)
    view = {k: v for k, v in olds.items() if k not in DOCUMENTS}
    if isinstance(digest, str):
        same = digest == digest_of(news)
        return view | {key: news.get(key) if same else _CHANGED for key in DOCUMENTS}
    if not isinstance(digests, dict):
        return olds
    for key in DOCUMENTS:
        new = news.get(key)
        if isinstance(new, str) and new and digests.get(key) == digest_text(new):
            view[key] = new
        elif key in digests:
            view[key] = _CHANGED
    return view


__all__ = [
    "DIGEST",
    "DIGESTS",
    "DOCUMENTS",
    "PACKED",
    "digest_of",
    "digest_text",
    "kept_digests",
    "pack",
    "packed",
    "state_view",
    "unpacked",
]
