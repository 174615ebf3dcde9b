"""BaseImage through the provider process on the testbed: images served on
loopback, inputs built, a create made, and the provider's log read from a
point on (tests/provider/test_baseimage*.py)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from providers.kvm.access import HostAccess
from providers.kvm.baseimage import BaseImageArgs, BaseImageProvider
from providers.kvm.volumes import MIB
from tests.harness.engine import ProviderProcess, make_urn, provider_inputs
from tests.support.http import FileServer

URN = make_urn("testbed-image")


@dataclass(frozen=True)
class Served:
    url: str
    path: str  # on the server
    file: Path
    digest: str

    @property
    def size(self) -> int:
        return self.file.stat().st_size


def random_qcow2(directory: Path, data_mib: int = 3, virtual_mib: int = 64) -> Path:
    """A valid qcow2 of `virtual_mib` with `data_mib` of random data (so its
    digest, and the base's name, is unique to this run)."""
    tag = uuid.uuid4().hex[:8]
    raw, image = directory / f"{tag}.raw", directory / f"{tag}.qcow2"
    with raw.open("wb") as out:
        out.write(os.urandom(data_mib * MIB))
        out.truncate(virtual_mib * MIB)
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(image)], check=True)
    raw.unlink()
    return image


def random_raw(directory: Path, mib: int) -> Path:
    path = directory / f"{uuid.uuid4().hex[:8]}.raw"
    path.write_bytes(os.urandom(mib * MIB))
    return path


def serve(server: FileServer, file: Path, **options: Any) -> Served:
    path = f"/{uuid.uuid4().hex[:8]}/{file.name}"
    url = server.add(path, file=file, **options)
    return Served(url, path, file, sha256_of(file))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(MIB):
            digest.update(chunk)
    return digest.hexdigest()


def inputs(
    access: HostAccess,
    url: str,
    sha256: str | None = None,
    fmt: str = "qcow2",
    provider: BaseImageProvider | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    props = BaseImageArgs.of(access, url, sha256, fmt, keep=False).to_props()
    return provider_inputs(provider or BaseImageProvider(), {**props, **overrides})


def names_of(props: dict[str, Any]) -> tuple[str, str]:
    return props["volume"], props["marker"]


def create(engine: ProviderProcess, props: dict[str, Any], made: list[str]) -> dict[str, Any]:
    made.extend(names_of(props))
    checked = engine.check(URN, {}, props)
    assert checked.failures == []
    return engine.create(URN, checked.inputs).properties


class LogWindow:
    """The provider's log from now on."""

    def __init__(self, engine: ProviderProcess) -> None:
        self.engine = engine
        self.start = len(engine.log_text())

    @property
    def text(self) -> str:
        return self.engine.log_text()[self.start :]

    def rpcs(self) -> list[str]:
        """One name per libvirt RPC (the trace's lines)."""
        return re.findall(r" kvm\.libvirt (vir\w+)", self.text)
