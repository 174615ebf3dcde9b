"""The fleet as the service sees it: the stack output `fleet` (manifest v1),
read from a file or from `pulumi stack output`, and re-read when it changes.

A file may hold either the manifest itself or the output of
`pulumi stack output --json --show-secrets` (an object with key `fleet`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from health.model import ProxyEndpoint
from proxyinfra.manifest import Manifest
from proxyinfra.printable import RULE, refused_character

PULUMI_TIMEOUT_S = 120.0


class FleetError(Exception):
    """The fleet could not be read or is not a valid manifest. `content` is
    the sha256 of what was read and refused (None when nothing was read), so
    one broken content is reported once however often it is read."""

    content: str | None = None


@dataclass(frozen=True)
class FleetProxy:
    name: str
    id: str
    provider: str
    type: str
    zone: str | None
    host: str
    port: int
    labels: Mapping[str, str]
    username: str | None = None
    # Never in repr: a proxy may end up in an exception message or a log line.
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """http://[user:pass@]host:port, credentials percent-encoded; only for lease answers."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        creds = ""
        if self.username is not None and self.password is not None:
            creds = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@"
        return f"http://{creds}{host}:{self.port}"

    def endpoint(self) -> ProxyEndpoint:
        return ProxyEndpoint(self.name, self.host, self.port, self.username, self.password)


@dataclass(frozen=True)
class Fleet:
    project: str
    stack: str
    proxies: Mapping[str, FleetProxy]  # by name, in manifest order

    def secrets(self) -> set[str]:
        return {p.password for p in self.proxies.values() if p.password}


def parse_fleet(document: Any) -> Fleet:
    """A Fleet from a decoded manifest, or from a stack-outputs object holding one.

    Every name is checked here, before any store sees it (the manifest's
    rules, proxyinfra/printable.py): a name no log, page or store could keep
    makes the whole manifest invalid, as any other error does."""
    if isinstance(document, dict) and "fleet" in document and "version" not in document:
        document = document["fleet"]
    unencodable = _unencodable(document)
    if unencodable is not None:
        # JSON may spell an unpaired surrogate (`"\ud800"`); pydantic cannot read it.
        loc, text = unencodable
        problem = f"{shown(text)} holds {refused_character(text)}: {RULE}"
        raise FleetError(f"not a valid fleet manifest v1: {_where(document, loc)}: {problem}")
    try:
        manifest = Manifest.model_validate(document, strict=True)
    except ValidationError as exc:
        # Only locations and messages, and the name of the proxy concerned:
        # the input may hold passwords.
        errors = exc.errors()
        problems = "; ".join(_where(document, e["loc"]) + f": {e['msg']}" for e in errors[:10])
        if len(errors) > 10:
            problems += f"; and {len(errors) - 10} more"
        raise FleetError(f"not a valid fleet manifest v1: {problems}") from None
    proxies: dict[str, FleetProxy] = {}
    for entry in manifest.proxies:
        if entry.name in proxies:
            raise FleetError(f"proxy name {entry.name!r} appears twice in the manifest")
        proxies[entry.name] = FleetProxy(
            name=entry.name,
            id=entry.id,
            provider=entry.provider,
            type=entry.type,
            zone=entry.zone,
            host=entry.host,
            port=entry.port,
            labels=dict(entry.labels),
            username=entry.auth.username if entry.auth else None,
            password=entry.auth.password if entry.auth else None,
        )
    return Fleet(manifest.project, manifest.stack, proxies)


def shown(name: str) -> str:
    """A name as an error shows it: quoted, escaped (repr escapes every
    character the names' rule refuses), and cut short."""
    return repr(name if len(name) <= 40 else name[:32] + "...")


def _where(document: Any, loc: tuple[int | str, ...]) -> str:
    """An error's place, as `proxies.3 (proxy 'home-3').zone`: the proxy's
    name beside its index, when the manifest gives it one as a string."""
    place = _joined(loc) or "(top)"
    if len(loc) < 2 or loc[0] != "proxies" or not isinstance(loc[1], int):
        return place
    try:
        name = document["proxies"][loc[1]]["name"]
    except (TypeError, KeyError, IndexError):
        return place
    if not isinstance(name, str):
        return place
    rest = _joined(loc[2:])
    return f"proxies.{loc[1]} (proxy {shown(name)})" + (f".{rest}" if rest else "")


_PLAIN = re.compile(r"[A-Za-z0-9_\-\[\]]+")


def _joined(loc: tuple[int | str, ...]) -> str:
    # A label's key is part of a place: shown escaped unless plain.
    return ".".join(
        p
        if isinstance(p, str) and _PLAIN.fullmatch(p)
        else str(p)
        if isinstance(p, int)
        else shown(p)
        for p in loc
    )


def _unencodable(value: Any, loc: tuple[int | str, ...] = ()) -> tuple[Any, str] | None:
    """The place of the first string, key or value, that no UTF-8 encodes
    (it holds an unpaired surrogate), and the string."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return loc, value
        return None
    children: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, item in children:
        found = _unencodable(key, loc) if isinstance(key, str) else None
        found = found or _unencodable(item, (*loc, key))
        if found is not None:
            return found
    return None


def _decode(text: str | bytes, where: str) -> Fleet:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FleetError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise FleetError(f"{where}: not UTF-8 text") from None
    try:
        return parse_fleet(document)
    except FleetError as exc:
        raise FleetError(f"{where}: {exc}") from None


class FleetSource:
    """Where the fleet comes from: a file, or a Pulumi stack.

    `load()` reads it (blocking); `changed()` says whether reading again could
    give something new: for a file, when its size, mtime or inode changed since
    the last successful load; for a stack, always (the caller polls it every
    so many seconds).
    """

    def __init__(self, *, path: Path | None = None, stack: str | None = None) -> None:
        if (path is None) == (stack is None):
            raise ValueError("give exactly one of path and stack")
        self.path = path
        self.stack = stack
        self._signature: tuple[int, int, int] | None = None

    @property
    def polls_command(self) -> bool:
        return self.stack is not None

    def describe(self) -> str:
        return f"file {self.path}" if self.path is not None else f"stack {self.stack}"

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self) -> bool:
        if self.path is None:
            return True
        return self._stat() != self._signature

    def load(self) -> Fleet:
        if self.path is not None:
            signature = self._stat()
            try:
                data = self.path.read_bytes()
            except OSError as exc:
                raise FleetError(f"cannot read {self.path}: {exc.strerror}") from None
            fleet = _decoded(data, str(self.path))
            # Recorded only after a successful parse: a file caught half
            # written is read again on the next poll.
            self._signature = signature
            return fleet
        return self._load_stack()

    def _load_stack(self) -> Fleet:
        assert self.stack is not None
        pulumi = shutil.which("pulumi")
        if pulumi is None:
            raise FleetError(
                "the pulumi CLI is not on PATH (https://www.pulumi.com/docs/install/); "
                "or give --fleet FILE with the output of `pulumi stack output --json --show-secrets`"
            )
        # The service's own token is no business of the pulumi process.
        env = {k: v for k, v in os.environ.items() if k != "DISCOVERY_TOKEN"}
        command = [pulumi, "stack", "output", "fleet", "--json", "--show-secrets"]
        command += ["--stack", self.stack, "--non-interactive"]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                timeout=PULUMI_TIMEOUT_S,
                env=env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise FleetError(
                f"pulumi stack output timed out after {PULUMI_TIMEOUT_S:.0f} s"
            ) from None
        if done.returncode != 0:
            # pulumi's stderr names the problem (no such stack, no passphrase)
            # and carries no output values.
            message = done.stderr.decode(errors="replace").strip()[-500:]
            raise FleetError(f"pulumi stack output failed ({done.returncode}): {message}")
        return _decoded(done.stdout, f"stack {self.stack}")


def _decoded(data: bytes, where: str) -> Fleet:
    try:
        return _decode(data, where)
    except FleetError as exc:
        exc.content = hashlib.sha256(data).hexdigest()
        raise
