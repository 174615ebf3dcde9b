"""scripts/oci-archive: a root filesystem directory as an OCI image archive
that containerd's `ctr images import` names by its annotations.

The script has no .py suffix (it is run as a program by
scripts/build-kube-images): loaded here with SourceFileLoader, on tiny trees
made in tmp_path."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import stat
import sys
import tarfile
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "oci-archive"
REF = "localhost/egress-proxies/squid:5.7-2_deb12u6"
MTIME = 1700000000
IS_ROOT = os.geteuid() == 0


def _load() -> ModuleType:
    name = "oci_archive_under_test"
    loader = SourceFileLoader(name, str(SCRIPT))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


oci = _load()


@dataclass
class Packed:
    root: Path
    archive: Path
    printed: dict[str, Any]
    members: dict[str, bytes]  # regular files of the archive by name

    def blob(self, digest: str) -> bytes:
        assert digest.startswith("sha256:"), digest
        return self.members["blobs/sha256/" + digest.removeprefix("sha256:")]

    def json_blob(self, digest: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.blob(digest))
        return document

    def index(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.members["index.json"])
        return document

    def manifest(self) -> dict[str, Any]:
        return self.json_blob(self.index()["manifests"][0]["digest"])

    def config(self) -> dict[str, Any]:
        return self.json_blob(self.manifest()["config"]["digest"])

    def layer(self) -> bytes:
        return self.blob(self.manifest()["layers"][0]["digest"])


def _make_tree(root: Path) -> None:
    """A few entries of every kind the layer handles."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("proxy:x:13:13:proxy:/bin:/usr/sbin/nologin\n")
    (root / "etc" / "passwd").chmod(0o644)
    (root / "usr" / "sbin").mkdir(parents=True)
    tool = root / "usr" / "sbin" / "squid"
    tool.write_bytes(b"\x7fELF not really\n")
    tool.chmod(0o755)
    helper = root / "usr" / "sbin" / "helper"
    helper.write_bytes(b"set-uid\n")
    helper.chmod(0o4755)
    os.link(tool, root / "usr" / "sbin" / "squid-hardlink")
    (root / "sbin").symlink_to("usr/sbin")
    spool = root / "var" / "spool" / "squid"
    spool.mkdir(parents=True)
    spool.chmod(0o750)
    os.mkfifo(root / "var" / "fifo")
    (root / "dev").mkdir()
    if IS_ROOT:
        os.chown(spool, 13, 13)
        os.chown(root / "etc" / "passwd", 13, 13, follow_symlinks=False)
        os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _pack(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> Packed:
    root = tmp_path / "root"
    if not root.exists():
        _make_tree(root)
    archive = tmp_path / "out" / "image.tar"
    argv = [
        "pack",
        "--ref",
        REF,
        "--mtime",
        str(MTIME),
        "--entrypoint",
        '["/usr/sbin/squid"]',
        "--cmd",
        '["-N", "-d", "1"]',
        "--expose",
        "3128/tcp",
        "--env",
        "PATH=/usr/sbin:/usr/bin",
        *extra,
        str(root),
        str(archive),
    ]
    assert oci.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    members: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member) if member.isfile() else None
            if data is not None:
                members[member.name] = data.read()
    return Packed(root=root, archive=archive, printed=printed, members=members)


@pytest.fixture
def packed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Packed:
    return _pack(tmp_path, capsys)


def _layer_members(layer: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        return tar.getmembers()


def test_the_layout_files_are_there(packed: Packed) -> None:
    assert json.loads(packed.members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    assert "index.json" in packed.members
    blobs = [n for n in packed.members if n.startswith("blobs/sha256/")]
    assert len(blobs) == 3  # config, manifest, layer
    assert [p.name for p in packed.archive.parent.iterdir()] == ["image.tar"]  # no leftovers


def test_every_blob_is_named_by_its_sha256(packed: Packed) -> None:
    for name, data in packed.members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.removeprefix("blobs/sha256/"), name


def test_the_index_and_manifest_point_at_their_blobs_with_the_right_sizes(packed: Packed) -> None:
    index = packed.index()
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    (entry,) = index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["size"] == len(packed.blob(entry["digest"]))
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["digest"] == packed.printed["digest"]

    manifest = packed.manifest()
    assert manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert manifest["config"]["size"] == len(packed.blob(manifest["config"]["digest"]))
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert layer["size"] == len(packed.blob(layer["digest"]))
    assert layer["digest"] == packed.printed["layer"]["digest"]


def test_the_config_names_the_uncompressed_layer_and_the_process(packed: Packed) -> None:
    config = packed.config()
    diff_id = "sha256:" + hashlib.sha256(gzip.decompress(packed.layer())).hexdigest()
    assert config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]}
    assert config["architecture"] == "amd64"
    assert config["os"] == "linux"
    assert config["created"] == "2023-11-14T22:13:20Z"
    assert config["config"] == {
        "Entrypoint": ["/usr/sbin/squid"],
        "Cmd": ["-N", "-d", "1"],
        "ExposedPorts": {"3128/tcp": {}},
        "Env": ["PATH=/usr/sbin:/usr/bin"],
    }  # no User: the pod's securityContext sets it


def test_the_ref_annotations_name_the_image_for_containerd(packed: Packed) -> None:
    (entry,) = packed.index()["manifests"]
    assert entry["annotations"] == {
        "io.containerd.image.name": REF,
        "org.opencontainers.image.ref.name": "5.7-2_deb12u6",
    }
    assert packed.printed["ref"] == REF


def test_the_layer_holds_the_tree_with_numeric_owners_modes_and_links(packed: Packed) -> None:
    members = {m.name: m for m in _layer_members(packed.layer())}
    names = list(members)
    assert names == [
        "dev",
        "etc",
        "etc/passwd",
        "sbin",
        "usr",
        "usr/sbin",
        "usr/sbin/helper",
        "usr/sbin/squid",
        "usr/sbin/squid-hardlink",
        "var",
        "var/fifo",
        "var/spool",
        "var/spool/squid",
    ]  # sorted, parents first; no device node
    for name, member in members.items():
        st = os.lstat(packed.root / name)
        assert (member.uid, member.gid) == (st.st_uid, st.st_gid), name
        assert member.uname == member.gname == "", name
        assert member.mode == stat.S_IMODE(st.st_mode), name
        assert member.mtime == min(int(st.st_mtime), MTIME), name
    if IS_ROOT:
        assert (members["var/spool/squid"].uid, members["var/spool/squid"].gid) == (13, 13)
    assert members["var/spool/squid"].isdir() and members["var/spool/squid"].mode == 0o750
    assert members["usr/sbin/helper"].mode == 0o4755
    assert members["usr/sbin/squid"].isfile() and members["usr/sbin/squid"].mode == 0o755
    assert members["usr/sbin/squid-hardlink"].islnk()
    assert members["usr/sbin/squid-hardlink"].linkname == "usr/sbin/squid"
    assert members["sbin"].issym() and members["sbin"].linkname == "usr/sbin"
    assert members["var/fifo"].isfifo()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(packed.layer()))) as tar:
        passwd = tar.extractfile("etc/passwd")
        assert passwd is not None and passwd.read().startswith(b"proxy:x:13:13:")
    assert packed.printed["layer"]["entries"] == len(names)
    assert packed.printed["layer"]["skipped"] == (1 if IS_ROOT else 0)


def test_the_same_tree_packs_to_the_same_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _pack(tmp_path, capsys)
    second = _pack(tmp_path, capsys)
    assert first.printed["digest"] == second.printed["digest"]
    assert first.printed["layer"] == second.printed["layer"]


def test_describe_reads_ref_and_digest_back(
    packed: Packed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert oci.main(["describe", f"squid={packed.archive}"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "squid": {"ref": REF, "digest": packed.printed["digest"], "archive": "image.tar"}
    }


@pytest.mark.parametrize(
    "ref",
    [
        "localhost/egress-proxies/squid:5.7",
        "localhost:5000/squid:1",
        "registry.example.com/team_a/squid-proxy:v1.2_3",
    ],
)
def test_fully_qualified_refs_are_accepted(ref: str) -> None:
    parsed = oci.parse_ref(ref)
    assert str(parsed) == ref


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("squid:1", "expected REGISTRY/PATH:TAG"),  # no registry part
        ("egress/squid:1", "not a registry"),  # CRI would look in docker.io
        ("localhost/egress-proxies/squid", "expected REGISTRY/PATH:TAG"),  # no tag
        ("localhost/Squid:1", "expected REGISTRY/PATH:TAG"),  # upper case
        ("localhost/squid:-1", "expected REGISTRY/PATH:TAG"),
        ("localhost/squid:5.7-2+deb12u6", "expected REGISTRY/PATH:TAG"),  # '+': sanitize first
        (f"localhost/squid@sha256:{'0' * 64}", "expected REGISTRY/PATH:TAG"),
        ("localhost/squid:" + "x" * 129, "expected REGISTRY/PATH:TAG"),
    ],
)
def test_a_bad_ref_is_refused_with_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ref: str, why: str
) -> None:
    with pytest.raises(ValueError, match="bad image reference") as raised:
        oci.parse_ref(ref)
    assert repr(ref) in str(raised.value) and why in str(raised.value)

    (tmp_path / "root").mkdir()
    archive = tmp_path / "image.tar"
    with pytest.raises(SystemExit) as exited:
        oci.main(["pack", "--ref", ref, str(tmp_path / "root"), str(archive)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --ref: bad image reference {ref!r}" in err
    assert not archive.exists()


def test_a_missing_root_is_an_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "image.tar"
    assert oci.main(["pack", "--ref", REF, str(tmp_path / "nope"), str(archive)]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert not archive.exists()
