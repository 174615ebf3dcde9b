"""What libvirt accepts in the host fields of the kvm config, stated once.

The stack config's validation (before any resource is registered) and the
domain XML builder (in the provider process) both ask these, so a value
`pulumi preview` accepts is one the domain can be built from. Each rule
answers with the problem as a predicate ("is not a Linux interface name ...")
or None.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

DomainType = Literal["kvm", "qemu"]
Firmware = Literal["uefi", "bios"]

CPU_MODES = ("host-passthrough", "host-model", "maximum")
"""``cpuMode`` values rendered as ``<cpu mode='VALUE'/>``; any other value names a
CPU model and renders as ``<cpu mode='custom'><model>VALUE</model></cpu>``."""

DEFAULT_CPU_MODE = "host-passthrough"
DEFAULT_DOMAIN_TYPE: DomainType = "kvm"
DEFAULT_FIRMWARE: Firmware = "uefi"
MIN_MEMORY_MIB = 128

_CPU_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no '/', ':' or whitespace.
_BRIDGE_RE = re.compile(r"[^\s/:]{1,15}")


def text_problem(value: object) -> str | None:
    """A non-empty string without control characters (newlines, tabs, NUL, ...):
    those cannot appear in XML 1.0 or are normalised away in attributes."""
    if not isinstance(value, str):
        return "is not a string"
    if not value:
        return "is empty"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cs"):
            return f"contains the control character {char!r}"
    return None


def cpu_mode_problem(value: object) -> str | None:
    if problem := text_problem(value):
        return problem
    if value == "custom":
        return "is not a CPU model; name the model itself"
    if value in CPU_MODES or _CPU_MODEL_RE.fullmatch(str(value)):
        return None
    return f"is not one of {', '.join(CPU_MODES)} or a CPU model name (e.g. Skylake-Client-v4)"


def bridge_problem(value: object) -> str | None:
    if problem := text_problem(value):
        return problem
    if not _BRIDGE_RE.fullmatch(str(value)) or value in (".", ".."):
        return "is not a Linux interface name (1-15 characters, no '/', ':' or spaces)"
    return None


def network_problem(value: object) -> str | None:
    if problem := text_problem(value):
        return problem
    return "contains '/'" if "/" in str(value) else None
