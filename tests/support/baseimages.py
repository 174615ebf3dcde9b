"""BaseImage through the provider process on the testbed: images served on
loopback, inputs built, a create made, and the provider's log read from a
point on (tests/provider/test_baseimage*.py); `BaseImageLab` holds all of it
for one test."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from providers.kvm.access import HostAccess
from providers.kvm.baseimage import BaseImageArgs, BaseImageProvider
from providers.kvm.volumes import MIB
from tests.harness.engine import ProviderError, ProviderProcess, make_urn, provider_inputs
from tests.support.http import FileServer
from tests.support.testbed import Testbed

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


@dataclass(frozen=True)
class BaseImageLab:
    """What a BaseImage test works with (the `lab` fixture of tests/provider):
    the module's provider process, the image server, the testbed, how the
    provider reaches it, its pool as root, the volumes to remove if the test
    fails half way (every create records its two), and a scratch directory."""

    engine: ProviderProcess
    server: FileServer
    testbed: Testbed
    access: HostAccess
    pool: Any
    made: list[str]
    scratch: Path

    def serve(self, file: Path, **options: Any) -> Served:
        return serve(self.server, file, **options)

    def qcow2(self, **options: Any) -> Served:
        """A new random qcow2 image, served with the server's OPTIONS."""
        return self.serve(random_qcow2(self.scratch), **options)

    def raw(self, mib: int, **options: Any) -> Served:
        return self.serve(random_raw(self.scratch, mib), **options)

    def inputs(
        self, url: str, sha256: str | None = None, fmt: str = "qcow2", **overrides: Any
    ) -> dict[str, Any]:
        return inputs(self.access, url, sha256, fmt, **overrides)

    def create(self, props: dict[str, Any]) -> dict[str, Any]:
        return create(self.engine, props, self.made)

    def failure(self, props: dict[str, Any]) -> ProviderError:
        """The error of a create that must fail."""
        with pytest.raises(ProviderError) as info:
            self.create(props)
        return info.value

    def delete(self, outs: dict[str, Any]) -> None:
        self.engine.delete(outs["volume"], URN, outs)

    def files(self) -> set[str]:
        """What is really in the pool's directory on the host."""
        return set(os.listdir(self.testbed.pool_path))
