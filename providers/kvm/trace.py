"""One log line per libvirt RPC on logger ``kvm.libvirt``.

libvirt objects are wrapped in :class:`Traced`: each call is logged with the
C API name (``virDomainLookupByName``), the identifiers involved, a curated
result, the duration, and on failure the libvirt error code name and number.
At TRACE (``EGRESS_PROXIES_LOG=2``) XML, interface addresses and listing names
are added. Stream payloads (image bytes, the seed ISO with cloud-init) are
never logged: stream calls are not traced at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import libvirt

from proxyinfra.logs import TRACE

log = logging.getLogger("kvm.libvirt")

# Python method -> C API, per wrapped class; the rest follow vir<Class><Method>.
_API: dict[tuple[str, str], str] = {
    ("Connect", "lookupByName"): "virDomainLookupByName",
    ("Connect", "lookupByUUIDString"): "virDomainLookupByUUIDString",
    ("Connect", "defineXML"): "virDomainDefineXML",
    ("Connect", "defineXMLFlags"): "virDomainDefineXMLFlags",
    ("Connect", "createXML"): "virDomainCreateXML",
    ("Connect", "storagePoolLookupByName"): "virStoragePoolLookupByName",
    ("Connect", "networkLookupByName"): "virNetworkLookupByName",
    ("Connect", "interfaceLookupByName"): "virInterfaceLookupByName",
    ("Connect", "listAllDomains"): "virConnectListAllDomains",
    ("Connect", "listAllStoragePools"): "virConnectListAllStoragePools",
    ("Connect", "listAllNetworks"): "virConnectListAllNetworks",
    ("Connect", "getFreeMemory"): "virNodeGetFreeMemory",
    ("Connect", "getInfo"): "virNodeGetInfo",
    ("Connect", "getMemoryStats"): "virNodeGetMemoryStats",
    ("Connect", "getCapabilities"): "virConnectGetCapabilities",
    ("Connect", "getDomainCapabilities"): "virConnectGetDomainCapabilities",
    ("Connect", "storageVolLookupByPath"): "virStorageVolLookupByPath",
    ("Connect", "isAlive"): "virConnectIsAlive",
    ("Domain", "create"): "virDomainCreate",
    ("Domain", "XMLDesc"): "virDomainGetXMLDesc",
    ("Domain", "state"): "virDomainGetState",
    ("Domain", "info"): "virDomainGetInfo",
    ("Domain", "metadata"): "virDomainGetMetadata",
    ("Domain", "setMetadata"): "virDomainSetMetadata",
    ("Domain", "interfaceAddresses"): "virDomainInterfaceAddresses",
    ("StoragePool", "storageVolLookupByName"): "virStorageVolLookupByName",
    ("StoragePool", "createXML"): "virStorageVolCreateXML",
    ("StoragePool", "listAllVolumes"): "virStoragePoolListAllVolumes",
    ("StoragePool", "info"): "virStoragePoolGetInfo",
    ("StoragePool", "XMLDesc"): "virStoragePoolGetXMLDesc",
    ("StorageVol", "XMLDesc"): "virStorageVolGetXMLDesc",
    ("StorageVol", "path"): "virStorageVolGetPath",
    ("StorageVol", "info"): "virStorageVolGetInfo",
    ("Network", "DHCPLeases"): "virNetworkGetDHCPLeases",
    ("Network", "XMLDesc"): "virNetworkGetXMLDesc",
}

# Calls answered from the client's own memory (no RPC), and stream I/O.
_LOCAL = {
    "name",
    "UUIDString",
    "key",  # virStorageVolGetKey: the key travels with the volume object
    "UUID",
    "ID",
    "connect",
    "close",
    "send",
    "newStream",  # virStreamNew only makes the client object
    "recv",
    "sendAll",
    "recvAll",
    "finish",
    "abort",
    "registerCloseCallback",
    "unregisterCloseCallback",
    "getURI",
    "setKeepAlive",
    "c_pointer",
}

_WRAPPED = {
    libvirt.virConnect: "Connect",
    libvirt.virDomain: "Domain",
    libvirt.virStoragePool: "StoragePool",
    libvirt.virStorageVol: "StorageVol",
    libvirt.virNetwork: "Network",
}

_STATES = {
    getattr(libvirt, n): n.removeprefix("VIR_DOMAIN_").lower()
    for n in dir(libvirt)
    if n.startswith("VIR_DOMAIN_")
    and n[len("VIR_DOMAIN_") :]
    in ("NOSTATE", "RUNNING", "BLOCKED", "PAUSED", "SHUTDOWN", "SHUTOFF", "CRASHED", "PMSUSPENDED")
}

_LEVEL_NAMES = {"VIR_ERR_NONE", "VIR_ERR_WARNING", "VIR_ERR_ERROR"}
ERROR_NAMES: dict[int, str] = {}
for _n in sorted(dir(libvirt)):
    if _n.startswith("VIR_ERR_") and _n not in _LEVEL_NAMES:
        ERROR_NAMES.setdefault(getattr(libvirt, _n), _n)


def error_label(error: libvirt.libvirtError) -> str:
    code = error.get_error_code()
    return f"{ERROR_NAMES.get(code, 'VIR_ERR_?')}({code})"


def api_name(kind: str, method: str) -> str:
    return _API.get((kind, method), f"vir{kind}{method[:1].upper()}{method[1:]}")


def state_name(state: int) -> str:
    return _STATES.get(state, str(state))


def _ident(kind: str, obj: Any) -> str:
    if kind == "Connect":
        return ""
    field = {
        "Domain": "domain",
        "StoragePool": "pool",
        "StorageVol": "volume",
        "Network": "network",
    }
    return f" {field[kind]}={obj.name()}"


def _arg_idents(api: str, args: tuple[Any, ...]) -> str:
    if (
        args
        and isinstance(args[0], str)
        and ("LookupByName" in api or api.endswith("ByUUIDString"))
    ):
        return f" name={args[0]}"
    return ""


def _curated(api: str, result: Any) -> str:
    if api == "virDomainGetState" and isinstance(result, list):
        return f" state={state_name(result[0])}"
    if api == "virDomainGetInfo" and isinstance(result, list):
        return f" state={state_name(result[0])} memKiB={result[2]} vcpus={result[3]}"
    if api == "virStorageVolGetPath":
        return f" path={result}"
    if api in ("virStoragePoolGetInfo", "virStorageVolGetInfo") and isinstance(result, list):
        return f" capacity={result[1]} allocation={result[2]}" + (
            f" available={result[3]}" if len(result) > 3 else ""
        )
    if api == "virDomainInterfaceAddresses" and isinstance(result, dict):
        nics = ",".join(f"{n}/{v.get('hwaddr')}" for n, v in result.items())
        text = f" interfaces={nics}"
        if log.isEnabledFor(TRACE):
            addrs = [a["addr"] for v in result.values() for a in (v.get("addrs") or [])]
            text += f" addresses={','.join(addrs)}"
        return text
    if isinstance(result, list) and api.startswith(("virConnectListAll", "virStoragePoolListAll")):
        text = f" count={len(result)}"
        if log.isEnabledFor(TRACE):
            text += f" names={','.join(o.name() for o in result)}"
        return text
    if isinstance(result, bool | int) and not isinstance(result, libvirt.virStream):
        return f" result={result}"
    return ""


def _xml(api: str, args: tuple[Any, ...], result: Any) -> str | None:
    """XML shown at TRACE: what was defined or read back."""
    if api.endswith(("XMLDesc", "DefineXML", "DefineXMLFlags", "CreateXML")) or api in (
        "virDomainGetMetadata",
        "virDomainSetMetadata",
    ):
        for value in (result, *args):
            if isinstance(value, str) and value.lstrip().startswith("<"):
                return value
    return None


class Traced:
    """Wraps a libvirt object; every RPC method call is logged. ``raw`` is the
    unwrapped object for APIs that need it (e.g. ``vol.upload(stream)``)."""

    def __init__(self, raw: Any, kind: str, context: str) -> None:
        self.raw = raw
        self._kind = kind
        self._context = context

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if not callable(attr) or name in _LOCAL or name.startswith("_"):
            return attr
        return self._traced(name, attr)

    def _traced(self, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        api = api_name(self._kind, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a.raw if isinstance(a, Traced) else a for a in args)
            where = f"{self._context}{_ident(self._kind, self.raw)}{_arg_idents(api, args)}"
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            except libvirt.libvirtError as error:
                ms = (time.perf_counter() - start) * 1000
                log.debug(
                    "%s %s failed %s: %s (%.2f ms)",
                    api,
                    where,
                    error_label(error),
                    error.get_error_message(),
                    ms,
                )
                raise
            ms = (time.perf_counter() - start) * 1000
            wrapped = wrap(result, self._context)
            log.debug("%s %s%s (%.2f ms)", api, where, _curated(api, result), ms)
            if log.isEnabledFor(TRACE) and (xml := _xml(api, args, result)) is not None:
                log.log(TRACE, "%s %s xml:\n%s", api, where, xml)
            return wrapped

        return call


def wrap(value: Any, context: str) -> Any:
    for cls, kind in _WRAPPED.items():
        if isinstance(value, cls):
            return Traced(value, kind, context)
    if isinstance(value, list) and value and any(isinstance(value[0], c) for c in _WRAPPED):
        return [wrap(v, context) for v in value]
    return value
