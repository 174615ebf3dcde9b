"""Validate a whole stack config and report every error at once.

Each error carries its config path and the offending value, e.g.
``proxies[2].placement.zone: unknown host 'nas9' (hosts: nas1, nas2)``. Parsing
is per entry so one broken provider does not hide the errors of the others.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pulumi
import yaml
from pydantic import BaseModel, ValidationError

from proxyinfra.cloudchecks import (
    GcpTargets,
    check_gcp_placement,
    check_gcp_provider,
    check_kubernetes_placement,
    check_kubernetes_provider,
    client_ranges,
)
from proxyinfra.config import (
    DOMAIN_PATTERN,
    GCP_IMAGE_PATTERN,
    GCP_PROJECT_PATTERN,
    GCP_REGION_PATTERN,
    IMAGE_REF_PATTERN,
    NAME_PATTERN,
    PROVIDER_TYPES,
    QUANTITY_PATTERN,
    ExternalProviderEntry,
    GcpProviderEntry,
    KubernetesProviderEntry,
    KvmProviderEntry,
    ProviderEntry,
    ProxyEntry,
    Squid,
)

TOP_LEVEL_KEYS = ("providers", "proxies", "squid")
PATTERN_WORDS = {
    NAME_PATTERN: "must be 1-40 lowercase letters, digits or '-', starting with a letter",
    GCP_IMAGE_PATTERN: "must be an image path projects/P/global/images/family/F "
    "or projects/P/global/images/NAME",
    QUANTITY_PATTERN: "must be a Kubernetes quantity such as 500m, 1, 64Mi or 1Gi",
    GCP_PROJECT_PATTERN: "must be a GCP project id: 6-30 lowercase letters, digits or '-', "
    "starting with a letter",
    GCP_REGION_PATTERN: "must be a GCP region such as europe-west1",
    IMAGE_REF_PATTERN: "must be a container image reference without spaces",
    DOMAIN_PATTERN: "must be a DNS domain such as cluster.local",
}
_VALUE_SHOWN = 60


@dataclass(frozen=True)
class ConfigIssue:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(pulumi.RunError):
    """Every error in the stack config, one per line. A RunError so that
    ``pulumi preview`` prints just this message, without a traceback."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        noun = "error" if len(self.issues) == 1 else "errors"
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        super().__init__(f"invalid stack config ({len(self.issues)} {noun}):\n{lines}")


@dataclass(frozen=True)
class Replica:
    """One proxy instance: a replica of a `proxies[]` entry."""

    name: str  # logical replica name, e.g. home-0
    entry: ProxyEntry
    index: int  # position of the entry in `proxies`
    provider: ProviderEntry


@dataclass(frozen=True)
class StackConfig:
    providers: dict[str, ProviderEntry]
    proxies: list[ProxyEntry]
    squid: Squid
    base_dir: Path
    warnings: list[str] = field(default_factory=list)

    def replicas(self) -> list[Replica]:
        result = []
        for index, entry in enumerate(self.proxies):
            provider = self.providers[entry.provider]
            if isinstance(provider, ExternalProviderEntry):
                result.append(Replica(entry.name, entry, index, provider))
                continue
            for i in range(entry.replica_count):
                result.append(Replica(f"{entry.name}-{i}", entry, index, provider))
        return result


def resolve_path(value: str, base_dir: Path) -> Path:
    """Config paths: `~` expanded, relative ones taken from the project directory."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else base_dir / path


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_SHOWN else text[: _VALUE_SHOWN - 3] + "..."


def _path(prefix: str, loc: Sequence[int | str]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional around a type annotation."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that holds the key at `loc` (to list its allowed keys)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if origin in (list, dict):
            tp = typing.get_args(tp)[-1]
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            by_alias = {(f.alias or n): f for n, f in tp.model_fields.items()}
            if part not in by_alias:
                return None
            tp = by_alias[str(part)].annotation
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _pydantic_issues(
    error: ValidationError, prefix: str, model: type[BaseModel]
) -> list[ConfigIssue]:
    issues = []
    for e in error.errors():
        loc = tuple(e["loc"])
        path = _path(prefix, loc)
        if e["type"] == "extra_forbidden":
            holder = _model_at(model, loc[:-1])
            allowed = (
                sorted((f.alias or n) for n, f in holder.model_fields.items()) if holder else []
            )
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            issues.append(ConfigIssue(path, f"unknown key (allowed: {', '.join(allowed)}){hint}"))
        elif e["type"] == "missing":
            issues.append(ConfigIssue(path, "required"))
        elif e["type"] == "string_pattern_mismatch" and e["ctx"]["pattern"] in PATTERN_WORDS:
            words = PATTERN_WORDS[e["ctx"]["pattern"]]
            issues.append(ConfigIssue(path, f"{words} (got {_show(e['input'])})"))
        else:
            msg = str(e["msg"]).removeprefix("Value error, ")
            issues.append(ConfigIssue(path, f"{msg} (got {_show(e['input'])})"))
    return issues


class _Collector:
    def __init__(self) -> None:
        self.issues: list[ConfigIssue] = []
        self.warnings: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(path, message))


def validate(raw: Mapping[str, Any], base_dir: Path) -> StackConfig:
    """Parse and check the config (keys without the namespace). Raises
    ConfigError listing every problem; returns the typed config otherwise."""
    c = _Collector()
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            c.add(f"egress-proxies:{key}", f"unknown key (allowed: {', '.join(TOP_LEVEL_KEYS)})")

    providers, broken = _parse_providers(raw.get("providers"), c)
    proxies = _parse_proxies(raw.get("proxies"), c)
    squid = _parse_squid(raw.get("squid"), c)

    for name, provider in providers.items():
        path = _provider_path(raw, name)
        if isinstance(provider, KvmProviderEntry):
            _check_kvm_provider(provider, path, base_dir, c)
        elif isinstance(provider, GcpProviderEntry):
            check_gcp_provider(provider, path, c)
        elif isinstance(provider, KubernetesProviderEntry):
            kubeconfig = provider.kubernetes.kubeconfig
            resolved = resolve_path(kubeconfig, base_dir) if kubeconfig is not None else None
            check_kubernetes_provider(provider, path, resolved, c)
    _check_proxies(proxies, providers, broken, c)
    if squid is not None:
        _check_squid(squid, proxies, providers, c)

    if c.issues:
        raise ConfigError(c.issues)
    assert squid is not None
    return StackConfig(
        providers=providers,
        proxies=[p for _, p in proxies],
        squid=squid,
        base_dir=base_dir,
        warnings=c.warnings,
    )


def _provider_path(raw: Mapping[str, Any], name: str) -> str:
    for i, entry in enumerate(raw.get("providers") or []):
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return f"providers[{i}]"
    return "providers[?]"


def _parse_providers(
    value: Any, c: _Collector
) -> tuple[dict[str, ProviderEntry], dict[str, Mapping[str, Any]]]:
    """Parsed providers by name, and the raw entries of those that have errors."""
    providers: dict[str, ProviderEntry] = {}
    broken: dict[str, Mapping[str, Any]] = {}
    if value is None:
        return providers, broken
    if not isinstance(value, list):
        c.add("providers", f"must be a list of providers (got {_show(value)})")
        return providers, broken
    types_list = ", ".join(sorted(PROVIDER_TYPES))
    for i, entry in enumerate(value):
        path = f"providers[{i}]"
        if not isinstance(entry, Mapping):
            c.add(path, f"must be a mapping (got {_show(entry)})")
            continue
        kind = entry.get("type")
        model = PROVIDER_TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            what = "required" if kind is None else f"unknown provider type {_show(kind)}"
            c.add(f"{path}.type", f"{what} (types: {types_list})")
            continue
        try:
            parsed = typing.cast(ProviderEntry, model.model_validate(entry))
        except ValidationError as error:
            c.issues.extend(_pydantic_issues(error, path, model))
            if isinstance(entry.get("name"), str):
                broken[entry["name"]] = entry
            continue
        if parsed.name in providers:
            c.add(f"{path}.name", f"duplicate provider name {parsed.name!r}")
            continue
        providers[parsed.name] = parsed
    return providers, broken


def _parse_proxies(value: Any, c: _Collector) -> list[tuple[int, ProxyEntry]]:
    proxies: list[tuple[int, ProxyEntry]] = []
    if value is None:
        return proxies
    if not isinstance(value, list):
        c.add("proxies", f"must be a list of proxies (got {_show(value)})")
        return proxies
    for i, entry in enumerate(value):
        try:
            proxies.append((i, ProxyEntry.model_validate(entry)))
        except ValidationError as error:
            c.issues.extend(_pydantic_issues(error, f"proxies[{i}]", ProxyEntry))
    return proxies


def _parse_squid(value: Any, c: _Collector) -> Squid | None:
    try:
        return Squid.model_validate(value if value is not None else {})
    except ValidationError as error:
        c.issues.extend(_pydantic_issues(error, "squid", Squid))
        return None


def _check_kvm_provider(
    provider: KvmProviderEntry, path: str, base_dir: Path, c: _Collector
) -> None:
    kvm = provider.kvm
    key = resolve_path(kvm.ssh_key_file, base_dir)
    if not key.is_file():
        c.add(f"{path}.kvm.sshKeyFile", f"file not found: {key}")
    if kvm.known_hosts_file is not None:
        known = resolve_path(kvm.known_hosts_file, base_dir)
        if not known.is_file():
            c.add(f"{path}.kvm.knownHostsFile", f"file not found: {known}")
    elif not kvm.insecure_ignore_host_key:
        c.add(
            f"{path}.kvm.knownHostsFile",
            "required (or set insecureIgnoreHostKey: true, which accepts any host key)",
        )
    if kvm.insecure_ignore_host_key:
        c.warnings.append(
            f"{path}.kvm.insecureIgnoreHostKey is true: host keys of provider "
            f"{provider.name!r} are not verified, so anyone who can intercept the SSH "
            "connection can impersonate the host and take over libvirt"
        )
    seen: set[str] = set()
    for j, host in enumerate(kvm.hosts):
        hpath = f"{path}.kvm.hosts[{j}]"
        if host.name in seen:
            c.add(f"{hpath}.name", f"duplicate host name {host.name!r}")
        seen.add(host.name)
        if (host.bridge is None) == (host.network is None):
            both = "both set" if host.bridge else "neither set"
            c.add(hpath, f"set exactly one of bridge or network ({both})")


def _check_proxies(
    proxies: list[tuple[int, ProxyEntry]],
    providers: dict[str, ProviderEntry],
    broken: dict[str, Mapping[str, Any]],
    c: _Collector,
) -> None:
    replica_names: dict[str, str] = {}
    for i, proxy in proxies:
        path = f"proxies[{i}]"
        provider = providers.get(proxy.provider)
        if provider is None and proxy.provider in broken:
            # Its own errors are listed already; still check what can be checked.
            entry = broken[proxy.provider]
            if entry.get("type") == "kvm":
                _check_kvm_placement(proxy, _KvmTargets.of_raw(proxy.provider, entry), path, c)
            elif entry.get("type") == "gcp":
                check_gcp_placement(proxy, GcpTargets.of_raw(proxy.provider, entry), path, c)
            continue
        if provider is None:
            known = ", ".join(providers) or "none defined"
            c.add(f"{path}.provider", f"unknown provider {proxy.provider!r} (providers: {known})")
            continue
        if isinstance(provider, ExternalProviderEntry):
            _check_external(proxy, path, c)
            names = [proxy.name]
        else:
            if proxy.url is not None:
                c.add(
                    f"{path}.url",
                    f"only for external providers ({provider.name!r} is {provider.type})",
                )
            if proxy.user_data is not None:
                _check_user_data(proxy, provider, path, c)
            if isinstance(provider, KvmProviderEntry):
                _check_kvm_placement(proxy, _KvmTargets.of(provider), path, c)
            elif isinstance(provider, GcpProviderEntry):
                check_gcp_placement(proxy, GcpTargets.of(provider), path, c)
            elif isinstance(provider, KubernetesProviderEntry):
                check_kubernetes_placement(proxy, path, c)
            names = [f"{proxy.name}-{r}" for r in range(proxy.replica_count)]
        for name in names:
            if name in replica_names:
                c.add(f"{path}.name", f"proxy name {name!r} also made by {replica_names[name]}")
            else:
                replica_names[name] = path


def _check_external(proxy: ProxyEntry, path: str, c: _Collector) -> None:
    if proxy.replicas is not None:
        c.add(f"{path}.replicas", "not allowed for an external proxy: one entry per URL")
    if proxy.placement.model_dump(exclude_none=True):
        c.add(f"{path}.placement", "not allowed for an external proxy")
    if proxy.user_data is not None:
        c.add(f"{path}.userData", "not allowed for an external proxy")
    if proxy.url is None:
        c.add(f"{path}.url", "required for an external proxy (http://[user:pass@]host:port)")
        return
    try:
        parts = urlsplit(proxy.url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    # Never echo the URL: it may carry the proxy's password.
    if parts is None or parts.scheme != "http" or not parts.hostname or port is None:
        c.add(
            f"{path}.url",
            f"must be http://[user:pass@]host:port (got scheme {parts.scheme if parts else '?'!r},"
            f" host {parts.hostname if parts else None!r}, port {port!r})",
        )
    elif parts.path not in ("", "/") or parts.query or parts.fragment:
        c.add(f"{path}.url", "must not have a path, query or fragment")


def _check_user_data(proxy: ProxyEntry, provider: ProviderEntry, path: str, c: _Collector) -> None:
    if isinstance(provider, KubernetesProviderEntry):
        c.add(f"{path}.userData", "not used by kubernetes proxies")
        return
    text = proxy.user_data or ""
    if not text.startswith("#cloud-config"):
        c.add(f"{path}.userData", "must be a cloud-config document starting with '#cloud-config'")
        return
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        c.add(f"{path}.userData", f"not valid YAML{where}")
        return
    if doc is not None and not isinstance(doc, dict):
        c.add(f"{path}.userData", f"must be a YAML mapping (got {type(doc).__name__})")


def _one_of(value: str | None, choices: Sequence[str], what: str, path: str, c: _Collector) -> bool:
    listed = ", ".join(choices) or "none defined"
    if value is None:
        c.add(path, f"required ({what}: {listed})")
        return False
    if value not in choices:
        c.add(path, f"unknown {what.rstrip('s')} {value!r} ({what}: {listed})")
        return False
    return True


@dataclass(frozen=True)
class _KvmTargets:
    """What kvm placement may name; taken leniently from the raw entry when the
    provider itself has errors, so placement errors are still all reported."""

    provider: str
    hosts: list[str]
    machine_types: list[str]
    images: list[str]

    @classmethod
    def of(cls, provider: KvmProviderEntry) -> _KvmTargets:
        kvm = provider.kvm
        hosts = [h.name for h in kvm.hosts]
        return cls(provider.name, hosts, list(kvm.machine_types), list(kvm.images))

    @classmethod
    def of_raw(cls, name: str, entry: Mapping[str, Any]) -> _KvmTargets:
        kvm = entry.get("kvm") if isinstance(entry.get("kvm"), Mapping) else {}
        assert isinstance(kvm, Mapping)

        def keys(key: str) -> list[str]:
            value = kvm.get(key)
            return [str(k) for k in value] if isinstance(value, Mapping) else []

        raw_hosts = kvm.get("hosts")
        hosts = [
            str(h["name"])
            for h in (raw_hosts if isinstance(raw_hosts, list) else [])
            if isinstance(h, Mapping) and "name" in h
        ]
        return cls(name, hosts, keys("machineTypes"), keys("images"))


def _check_kvm_placement(proxy: ProxyEntry, kvm: _KvmTargets, path: str, c: _Collector) -> None:
    hosts = kvm.hosts
    zone = proxy.placement.zone
    if zone is None and len(hosts) > 1:
        c.add(
            f"{path}.placement.zone",
            f"required when provider {kvm.provider!r} has several hosts (hosts: {', '.join(hosts)})",
        )
    elif zone is not None and zone not in hosts:
        c.add(f"{path}.placement.zone", f"unknown host {zone!r} (hosts: {', '.join(hosts)})")
    _one_of(
        proxy.placement.machine_type,
        kvm.machine_types,
        "machineTypes",
        f"{path}.placement.machineType",
        c,
    )
    image = proxy.placement.image
    if image is None or (image not in kvm.images and not _is_http_url(image)):
        listed = ", ".join(kvm.images) or "none defined"
        what = "required" if image is None else f"unknown image {image!r}"
        c.add(f"{path}.placement.image", f"{what} (images: {listed}; or an http(s) URL)")


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _check_squid(
    squid: Squid,
    proxies: list[tuple[int, ProxyEntry]],
    providers: dict[str, ProviderEntry],
    c: _Collector,
) -> None:
    provisioned = any(
        p.provider in providers and not isinstance(providers[p.provider], ExternalProviderEntry)
        for _, p in proxies
    )
    if provisioned and not squid.allowed_clients:
        c.add(
            "squid.allowedClients", "required: the CIDRs of the crawlers that may use the proxies"
        )
    if squid.allow_open_proxy_to_the_internet:
        everyone = client_ranges(squid.allowed_clients).everyone
        if everyone and provisioned:
            c.warnings.append(
                "squid.allowOpenProxyToTheInternet is true: squid, the GCP firewall rules and "
                f"the Kubernetes NetworkPolicies admit every {' and '.join(everyone)} address "
                "on the proxy port; anyone who finds a proxy can use it"
                + ("" if squid.auth else ", and without squid.auth nothing stops them")
            )
        return
    # The same list opens squid, the GCP firewall and the Kubernetes
    # NetworkPolicy / load balancer, so one flag governs all three.
    hint = "set squid.allowOpenProxyToTheInternet: true if that is really meant"
    whole = False
    for j, cidr in enumerate(squid.allowed_clients):
        if ipaddress.ip_network(cidr).prefixlen == 0:
            whole = True
            c.add(
                f"squid.allowedClients[{j}]",
                f"{cidr!r} opens the proxies to the whole internet; {hint}",
            )
    everyone = client_ranges(squid.allowed_clients).everyone
    if everyone and not whole:
        c.add(
            "squid.allowedClients",
            f"together these admit every {' and '.join(everyone)} address, which opens the "
            f"proxies to the whole internet; {hint}",
        )
