"""SeedIso: the proxy's cloud-init NoCloud seed, an ISO built in memory
(providers.kvm.iso) and uploaded into the host's pool as a raw volume.

Secrets: user-data carries the squid password hash and whatever the operator
added, vendor-data and network-config may carry secrets too. They are Pulumi
secrets in state, never logged at any level and never quoted in an error.
meta-data (instance-id, hostname) is not secret, but travels packed with
them (its instance-id holds a digest of the user-data, a secret's taint).
The ISO's sha256 is a secret output as well: it is a plain, unsalted digest
of the documents, so when they are mostly known (the stack config) a state
reader could test guesses of a low-entropy secret in them against it. Change
detection does not need it in clear.

A change of a document rewrites the seed in place (the domain decides
what the change needs: providers/kvm/domain.py, squidfiles.py); another
host or name replaces it, and the name is fixed per proxy, so the old one
is deleted first.

A seed volume that already exists when create runs (a create killed half way)
is replaced: its content is derived entirely from the inputs, unlike an
overlay's, so nothing is lost.

The documents are kept in the state once, packed into the one input
``documents``; the outputs keep one digest of them, which is all diff needs
of them, and what delete and read need (``host``, ``name``): see
providers.kvm.seeddocs, which also reads the earlier forms.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Generic

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from providers.kvm.access import HostAccess
from providers.kvm.args import Change, Made, ResourceArgs, arg, is_unknown
from providers.kvm.iso import build_nocloud_iso
from providers.kvm.resource import VolumeProvider
from providers.kvm.seeddocs import (
    DIGEST,
    DIGESTS,
    DOCUMENTS,
    OPTIONAL_DOCUMENTS,
    PACKED,
    kept_digests,
    pack,
    state_view,
    unpacked,
)
from providers.kvm.volumes import (
    human,
    lookup_pool,
    lookup_volume,
    parse_volume_xml,
    require_space,
    upload,
    volume_xml,
)
from proxyinfra.rollout import gated
from proxyinfra.stacktrace import short_stack_trace

SECRET_OUTPUTS = ["userData", "vendorData", "networkConfig", "sha256", DIGEST, DIGESTS]


def _document_failure(key: str, value: Any) -> CheckFailure | None:
    """A reason naming only the key and the type: never the content."""
    if is_unknown(value):
        return None  # preview: rendered from outputs not known yet
    if value is None and key in OPTIONAL_DOCUMENTS:
        return None
    if not isinstance(value, str):
        return CheckFailure(key, f"must be text, got {type(value).__name__}")
    if key == "metaData" and not value.strip():
        return CheckFailure(key, "must not be empty: it holds the instance-id")
    return None


@dataclass(frozen=True)
class SeedArgs(ResourceArgs, Generic[Made]):
    """SeedIso's inputs: another host or name replaces the seed (the name is
    fixed, so the old one is deleted first); new documents rewrite it in place."""

    host: HostAccess = arg("host", Change.REPLACE, HostAccess)
    name: str = arg("name", Change.REPLACE, str)
    user_data: Made = arg("userData", Change.UPDATE, str)
    meta_data: Made = arg("metaData", Change.UPDATE, str)
    vendor_data: str | None = arg("vendorData", Change.UPDATE, str, optional=True, default=None)
    network_config: str | None = arg(
        "networkConfig", Change.UPDATE, str, optional=True, default=None
    )


def _args(props: dict[str, Any]) -> SeedArgs[str]:
    return SeedArgs.from_props(unpacked(props))


def build_seed(props: dict[str, Any]) -> bytes:
    args = _args(props)
    return build_nocloud_iso(args.user_data, args.meta_data, args.vendor_data, args.network_config)


def _stored(props: dict[str, Any], path: str, size: int, sha256: str) -> dict[str, Any]:
    """The outputs: what delete and read need, and the digest for diff; PROPS
    are the inputs, or outputs of any form (c9adc8f's hold the documents)."""
    return {
        "host": props["host"],
        "name": props["name"],
        "path": path,
        "size": size,
        "sha256": sha256,
    } | kept_digests(props)


class SeedIsoProvider(VolumeProvider):
    kind = "seed"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        try:
            documents = unpacked(news)
        except ValueError as error:
            return CheckResult(news, [CheckFailure(PACKED, str(error))])
        failures = [f for key in DOCUMENTS if (f := _document_failure(key, documents.get(key)))]
        name = news.get("name")
        if not is_unknown(name) and (not isinstance(name, str) or not name):
            failures.append(CheckFailure("name", "the volume name must be a non-empty string"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        documents = unpacked(news)
        view = state_view(olds, documents)
        replaces = SeedArgs.changed(view, documents, Change.REPLACE)
        updates = SeedArgs.changed(view, documents, Change.UPDATE)
        return DiffResult(
            changes=bool(replaces or updates),
            replaces=replaces,
            delete_before_replace=True,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        name, path, size, sha256 = self._write(
            props, "replacing a seed volume left by an earlier run"
        )
        return CreateResult(id_=name, outs=_stored(props, path, size, sha256))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """New documents, in place: a running domain keeps the seed it booted
        from open (the old file) and reads this one at its next start."""
        _name, path, size, sha256 = self._write(news, None)
        return UpdateResult(outs=_stored(news, path, size, sha256))

    def _write(
        self, props: dict[str, Any], leftover_warning: str | None
    ) -> tuple[str, str, int, str]:
        """The seed volume made from PROPS' documents, whatever was there by
        its name; (name, path, size, sha256)."""
        args = _args(props)
        access, name = args.host, args.name
        log = self.logger(access, name)
        image = build_seed(props)
        conn = self.connection(props).libvirt()
        pool = lookup_pool(conn, access)
        leftover = lookup_volume(pool, name)
        if leftover is not None:
            if leftover_warning is not None:
                log.warning(leftover_warning)
            leftover.delete(0)
        require_space(pool, len(image), access, f"seed {name!r}")
        vol = pool.createXML(volume_xml(name, len(image), "raw"), 0)
        try:
            self._send(conn, vol, image)
            path = vol.path()
        except BaseException as error:
            self._discard(props, error)
            raise
        log.info("seed uploaded to %s (%s)", path, human(len(image)))
        return name, path, len(image), hashlib.sha256(image).hexdigest()

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # The outputs hold no documents (and an earlier release's all of them).
        conn = self.connection(props).libvirt()
        vol = lookup_volume(lookup_pool(conn, self.access(props)), props["name"])
        if vol is None:
            return ReadResult(id_="", outs={})
        info = parse_volume_xml(vol.XMLDesc(0))
        # The content is not read back: sha256 stays what was uploaded.
        outs = _stored(props, info.path, info.capacity, props.get("sha256", ""))
        return ReadResult(id_=id_, outs=outs)

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _send(conn: Any, vol: Any, image: bytes) -> None:
        """Separate so a test can make the upload fail."""
        upload(conn, vol, [image], len(image))


class SeedIso(pulumi.dynamic.Resource):
    """The NoCloud seed: inputs ``host``, ``name``, ``userData``, ``metaData``,
    ``vendorData``, ``networkConfig``, sent packed as one secret input
    ``documents`` (providers/kvm/seeddocs.py); AFTER holds its registration
    back (proxyinfra.rollout.gated); outputs ``host``, ``name``,
    ``path``, ``size`` (bytes), ``sha256`` of the ISO and ``digest`` of the
    documents (both secret)."""

    path: pulumi.Output[str]
    size: pulumi.Output[float]
    sha256: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        args: SeedArgs[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
        after: pulumi.Input[str] | None = None,
    ) -> None:
        given = (args.user_data, args.meta_data, args.vendor_data, args.network_config)
        documents: pulumi.Output[str] = pulumi.Output.all(*given).apply(
            lambda docs: pack(dict(zip(DOCUMENTS, docs, strict=True)))
        )
        # Secret, whatever the caller passed: inputs are kept in state.
        packed: pulumi.Output[str] = pulumi.Output.secret(documents)
        props: dict[str, Any] = {k: v for k, v in args.to_props().items() if k not in DOCUMENTS} | {
            PACKED: packed,
            "path": None,
            "size": None,
            "sha256": None,
        }
        props["name"] = gated(props["name"], after)
        options = pulumi.ResourceOptions(
            additional_secret_outputs=SECRET_OUTPUTS, delete_before_replace=True
        )
        with short_stack_trace():
            super().__init__(
                SeedIsoProvider(), resource_name, props, pulumi.ResourceOptions.merge(opts, options)
            )


__all__ = ["SeedArgs", "SeedIso", "SeedIsoProvider", "build_seed"]
