"""SeedIso through the engine's gRPC path against the testbed's libvirtd: the
bytes on the host, secrecy of the documents (state, log, errors), replacement,
deletion and a failed upload."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pulumi
import pytest

from providers.kvm.seeddocs import packed
from providers.kvm.seediso import SeedArgs, SeedIso, SeedIsoProvider, build_seed
from providers.kvm.volumes import MIB, lookup_volume, upload, volume_xml
from proxyinfra.cloudinit import default_vendor_data, render_meta_data
from proxyinfra.names import proxy_id, seed_volume
from tests.harness.engine import (
    DYNAMIC_TYPE,
    ProviderError,
    ProviderProcess,
    make_urn,
    provider_inputs,
)
from tests.harness.program import run_program
from tests.support.testbed import Testbed, access_for, load_testbed

# The most verbose level: volume XML and listings are logged, documents never.
pytestmark = [pytest.mark.integration, pytest.mark.provider_engine(log="2")]
libvirt.registerErrorHandler(lambda _c, _e: None, None)

# Appears in user-data only; it must never reach a log line or an error.
MARKER = "seed-marker-" + uuid.uuid4().hex


class FailingUploadProvider(SeedIsoProvider):
    """Loses the connection half way through the upload (pickled by
    reference: the provider process imports this module)."""

    @staticmethod
    def _send(conn: Any, vol: Any, image: bytes) -> None:
        def chunks() -> Iterator[bytes]:
            yield image[: len(image) // 2]
            raise ConnectionError("injected: connection lost mid-upload")

        upload(conn, vol, chunks(), len(image))


@pytest.fixture
def proxy(pool: Any) -> Iterator[str]:
    pid = proxy_id("egress-proxies", "seed-test", uuid.uuid4().hex)
    yield pid
    if (vol := lookup_volume(pool, seed_volume(pid))) is not None:
        vol.delete(0)


def documents(pid: str, **changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "userData": f"#cloud-config\nwrite_files:\n  - path: /etc/proxy-token\n    content: {MARKER}\n",
        "metaData": render_meta_data(pid, pid),
        "vendorData": default_vendor_data(),
        "networkConfig": None,
    }
    values.update(changes)
    return values


def props(
    testbed: Testbed, pid: str, provider: SeedIsoProvider | None = None, **changes: Any
) -> dict[str, Any]:
    """The inputs as SeedIso sends them: the documents packed into one."""
    values: dict[str, Any] = {
        "host": access_for(testbed).to_props(),
        "name": seed_volume(pid),
        **documents(pid, **changes),
        "path": None,
        "size": None,
        "sha256": None,
    }
    return provider_inputs(provider or SeedIsoProvider(), packed(values))


def volume_names(pool: Any) -> list[str]:
    return [v.name() for v in pool.listAllVolumes(0)]


def rpc_lines(engine: ProviderProcess, since: int) -> list[str]:
    return [line for line in engine.log_text()[since:].splitlines() if " kvm.libvirt " in line]


def test_create_uploads_exactly_the_built_iso(
    engine: ProviderProcess, testbed: Testbed, proxy: str
) -> None:
    urn = make_urn(f"{proxy}-seed")
    checked = engine.check(urn, {}, props(testbed, proxy))
    assert checked.failures == []
    mark = len(engine.log_text())
    created = engine.create(urn, checked.inputs)
    create_rpcs = rpc_lines(engine, mark)
    out = created.properties
    expected = build_seed(checked.inputs)
    on_host = Path(out["path"]).read_bytes()  # the pool file, read as root
    assert on_host == expected
    assert out["sha256"] == hashlib.sha256(on_host).hexdigest()
    assert out["size"] == len(expected)
    blkid = subprocess.run(
        ["blkid", "-p", "-o", "export", out["path"]], capture_output=True, text=True, check=True
    ).stdout
    found = dict(w.split("=", 1) for w in shlex.split(blkid))
    assert (found["LABEL"], found["TYPE"]) == ("cidata", "iso9660")
    assert len(create_rpcs) <= 8, "\n".join(create_rpcs)
    assert not any("virStorageVolGetXMLDesc" in line and MARKER in line for line in create_rpcs)

    mark = len(engine.log_text())
    read = engine.read(created.id, urn, out)
    assert len(rpc_lines(engine, mark)) <= 4
    assert (read.id, read.properties["path"], read.properties["size"]) == (
        created.id,
        out["path"],
        out["size"],
    )
    log = engine.log_text()
    assert "TRACE kvm.libvirt virStorageVolCreateXML" in log  # level 2 really is on
    assert MARKER not in log


def test_a_changed_document_rewrites_the_seed_in_place(
    engine: ProviderProcess, testbed: Testbed, proxy: str
) -> None:
    urn = make_urn(f"{proxy}-seed")
    out = engine.create(urn, props(testbed, proxy)).properties
    assert engine.diff(proxy, urn, out, props(testbed, proxy)).action == "same"
    for key, value in (
        ("userData", "#cloud-config\n{}\n"),
        ("metaData", render_meta_data(proxy, "other-host")),
        ("vendorData", None),
        ("networkConfig", "version: 2\n"),
    ):
        change: dict[str, Any] = {key: value}
        diff = engine.diff(proxy, urn, out, props(testbed, proxy, **change))
        assert (diff.action, diff.replaces) == ("update", []), key
    # The update as the engine runs it: the same volume, the new content.
    news = props(testbed, proxy, userData="#cloud-config\n{}\n")
    new = engine.update(proxy, urn, out, news)
    assert new["path"] == out["path"] and new["sha256"] != out["sha256"]
    assert hashlib.sha256(Path(new["path"]).read_bytes()).hexdigest() == new["sha256"]
    assert engine.diff(proxy, urn, new, news).action == "same"
    # Another name is another volume: a replacement, deleting first (fixed names).
    moved = engine.diff(proxy, urn, new, props(testbed, proxy) | {"name": "other-seed.iso"})
    assert (moved.action, moved.delete_before_replace) == ("replace", True)


def test_delete_removes_the_volume_tolerantly_and_refresh_sees_it_gone(
    engine: ProviderProcess, testbed: Testbed, proxy: str, pool: Any
) -> None:
    urn = make_urn(f"{proxy}-seed")
    out = engine.create(urn, props(testbed, proxy)).properties
    assert seed_volume(proxy) in volume_names(pool)
    engine.delete(proxy, urn, out)
    assert seed_volume(proxy) not in volume_names(pool)
    engine.delete(proxy, urn, out)  # already gone: fine

    out = engine.create(urn, props(testbed, proxy)).properties
    pool.storageVolLookupByName(seed_volume(proxy)).delete(0)  # out of band
    assert engine.read(proxy, urn, out).id == ""


def test_a_failed_upload_leaves_nothing_and_says_nothing_of_the_content(
    engine: ProviderProcess, testbed: Testbed, proxy: str, pool: Any
) -> None:
    with pytest.raises(ProviderError) as failed:
        engine.create(make_urn(f"{proxy}-seed"), props(testbed, proxy, FailingUploadProvider()))
    assert "connection lost mid-upload" in failed.value.message
    assert MARKER not in failed.value.details  # the whole traceback the engine shows
    assert seed_volume(proxy) not in volume_names(pool)
    assert MARKER not in engine.log_text()


def test_a_leftover_seed_is_replaced(
    engine: ProviderProcess, testbed: Testbed, proxy: str, pool: Any
) -> None:
    pool.createXML(volume_xml(seed_volume(proxy), 1 * MIB, "raw"), 0)  # a killed create's
    out = engine.create(make_urn(f"{proxy}-seed"), props(testbed, proxy)).properties
    assert Path(out["path"]).read_bytes() == build_seed(props(testbed, proxy))


def test_check_names_bad_documents_without_quoting_them(
    engine: ProviderProcess, testbed: Testbed, proxy: str
) -> None:
    bad = props(testbed, proxy, metaData="  ", networkConfig=["not", MARKER])
    failures = engine.check(make_urn(f"{proxy}-seed"), {}, bad).failures
    assert dict(failures) == {
        "metaData": "must not be empty: it holds the instance-id",
        "networkConfig": "must be text, got list",
    }
    assert MARKER not in engine.log_text()


def seed_program() -> dict[str, Any]:
    """A stack with one SeedIso (run by test_the_resource_keeps_documents_secret)."""
    config = pulumi.Config()
    pid = config.require("proxy")
    docs = documents(pid, networkConfig="version: 2\n")
    seed = SeedIso(
        "seed",
        SeedArgs(
            host=access_for(load_testbed()),
            name=seed_volume(pid),
            user_data=docs["userData"],  # plain: the class makes it secret
            meta_data=docs["metaData"],
            vendor_data=docs["vendorData"],
            network_config=docs["networkConfig"],
        ),
    )
    return {"path": seed.path, "sha256": seed.sha256}


def test_the_resource_keeps_documents_and_digest_secret(testbed: Testbed, proxy: str) -> None:
    result = run_program(
        "tests.provider.test_seediso:seed_program",
        {"proxy": proxy},
        hybrid=True,
        mode="up-destroy",
        env={"EGRESS_PROXIES_LOG": "2"},
    ).raise_for_error()
    seed = result.resource("seed", DYNAMIC_TYPE)
    assert "documents" in seed.secret_inputs  # all four, packed (providers/kvm/seeddocs.py)
    assert not {"userData", "metaData", "vendorData", "networkConfig"} & set(seed.inputs)
    assert {"digest", "sha256"} <= set(seed.secret_outputs)
    assert "path" not in seed.secret_outputs and "size" not in seed.secret_outputs
    assert result.is_secret("sha256") and not result.is_secret("path")
    assert result.deleted == result.created  # destroyed again
    assert MARKER not in result.provider_log
